import sys

from schedlang.cli import main

sys.exit(main())
