"""``python -m headrace_operator``: see :mod:`headrace_operator.main`."""

import sys

from headrace_operator.main import main

sys.exit(main())
