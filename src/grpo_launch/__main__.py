from grpo_launch.cli import main

raise SystemExit(main())
