import sys

from nri_framework.cli import main

sys.exit(main())
