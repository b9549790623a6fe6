"""``python -m kubeproxy`` runs the command line."""

import sys

from kubeproxy.cli import main

sys.exit(main())
