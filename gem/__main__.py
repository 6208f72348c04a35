import sys

from gem.cli import main

sys.exit(main())
