"""Start-up hooks put on PYTHONPATH of a trial's processes (see each folder)."""
