"""`python -m training.report`: see training/report/build.py."""

from training.report.build import main

raise SystemExit(main())
