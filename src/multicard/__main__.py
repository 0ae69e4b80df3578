"""`python -m multicard` is the same program as the `multicard` console script."""

from multicard.cli import main

raise SystemExit(main())
