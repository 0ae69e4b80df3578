"""Plan: an experiment file becomes the trials to run: its settings and grid (`spec`, `params`,
`precision`), each trial's command line (`launch`) and estimated cost (`cost`, `calibrate`)."""
