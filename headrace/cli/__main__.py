import sys

from headrace.cli.main import main

sys.exit(main())
