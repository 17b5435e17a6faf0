"""`python -m capacity`: the console script, as a module (the one import of cli from inside the package)."""

from capacity.cli import main

raise SystemExit(main())
