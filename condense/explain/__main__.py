import sys

from condense.explain.run import main

sys.exit(main())
