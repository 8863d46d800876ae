"""What the commands that start onelane's processes share: the settings, read once with `--log-level` over
ONELANE_LOG_LEVEL and logging set up at their level, and the check that MLX loads here."""

from __future__ import annotations

import logging
import subprocess
import sys

import click

from tasks.errors import OnelaneError
from tasks.settings import LOG_FORMAT, Settings


def read_settings() -> Settings:
    """The settings from the environment, `--log-level` over ONELANE_LOG_LEVEL; logging is set up at their level."""
    try:
        settings = Settings.from_env()
    except OnelaneError as exc:
        raise click.ClickException(exc.message) from None
    override = click.get_current_context().find_root().params["log_level"]
    if override is not None:
        settings = settings.model_copy(update={"log_level": override})
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    return settings


def check_mlx() -> None:
    """Stop with what to install when MLX cannot load here (in a child: the supervisor never imports MLX)."""
    probe = subprocess.run([sys.executable, "-c", "import mlx.core"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise click.ClickException(
            f"MLX cannot load on this machine ({last}). On Linux install one of its builds with the worker: "
            "`pip install 'onelane[cpu]'` or, with an NVIDIA GPU, `pip install 'onelane[cuda]'` "
            "(./dev.sh does it: ONELANE_MLX=cpu or cuda)."
        )
