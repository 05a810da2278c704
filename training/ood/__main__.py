"""`python -m training.ood`: the same as `capsnet-ood` (training.ood.calibrate)."""

import sys

from training.ood.calibrate import main

sys.exit(main())
