import sys

from gem_app.cli import main

sys.exit(main())
