import sys

from nri_framework.launch import main

sys.exit(main())
