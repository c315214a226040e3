from flowserve.cli import main

raise SystemExit(main())
