import sys

from condense.verify.run import main

sys.exit(main())
