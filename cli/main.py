"""The `onelane` command (`onelane = cli.main:main`; `python -m cli.main` runs it too): the group and its commands.

Its commands: up, web, worker and redis (cli/serve.py); import-gguf and make-demo-model (cli/models.py); and the
terminal client's run, submit, tail, jobs and cancel (cli/jobs.py), chat (cli/chat.py) and batch (cli/batch.py).
Importing it imports neither web/ nor worker/ nor the client's HTTP stack: each waits until a command that needs it
runs (`onelane web` must let gevent patch ssl and friends first).
"""

from __future__ import annotations

from typing import get_args

import click

from cli import batch, chat, jobs, models, serve
from tasks.settings import LogLevel


@click.group(context_settings={"show_default": True})  # every command shows its defaults
@click.option(
    "--log-level",
    type=click.Choice(get_args(LogLevel), case_sensitive=False),
    help="Log at this level: overrides ONELANE_LOG_LEVEL (default INFO).",
)
def main(log_level: str | None) -> None:
    """onelane: a fair, observable job queue in front of one GPU running MLX."""
    # The commands that start onelane's processes read the settings and set up logging with them (cli/startup.py).


for command in (
    serve.up,
    serve.web,
    serve.worker,
    serve.redis,
    models.import_gguf_cmd,
    models.make_demo_model_cmd,
    jobs.run,
    chat.chat,
    jobs.submit,
    jobs.tail,
    jobs.jobs,
    jobs.cancel,
    batch.batch,
):
    main.add_command(command)


if __name__ == "__main__":
    main()
