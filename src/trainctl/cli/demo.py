"""`trainctl demo`: a real tiny YOLO training on CPU (src/trainctl/config/demo.py makes its
job), run as `trainctl run` runs a job."""

from __future__ import annotations

from trainctl.cli.common import UsageError, note
from trainctl.cli.run import cmd_run


def cmd_demo(args) -> int:
    from trainctl.config.demo import DEMO_EPOCHS, demo_length_text, make_demo_job
    from trainctl.store.paths import cache_dir

    if args.epochs is not None and args.epochs < 1:
        raise UsageError(f"--epochs: must be 1 or more (got {args.epochs})")
    root = cache_dir() / "demo"
    epochs = args.epochs or DEMO_EPOCHS
    if not (args.json or args.headless):  # the text lines say it themselves
        note(demo_length_text(epochs))
    job = make_demo_job(root, epochs=epochs)
    args.job = str(job)
    args.command_argv = []
    return cmd_run(args)
