from tidal.cli import main

raise SystemExit(main())
