import sys

from specui.cli import main

sys.exit(main())
