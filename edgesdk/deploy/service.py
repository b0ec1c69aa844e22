"""``--service``: a systemd unit that serves the deployed bundle, once edgesdk has a server command.

Until ``edgesdk serve`` exists, deploy refuses ``--service`` before it touches the board, says
why, and exits non-zero. :func:`render_unit` is the unit it will write (``current`` is a link, so
the unit survives redeploys and rollbacks; a restart picks up the new release).
"""

from __future__ import annotations

import shlex

from edgesdk import __version__
from edgesdk.deploy.transport import DeployError

SERVER_COMMAND = "serve"


def require_server_command(commands: dict) -> None:
    """Refuse --service while this edgesdk has no server command."""
    if SERVER_COMMAND not in commands:
        raise DeployError(
            f"--service installs a systemd unit that runs 'edgesdk {SERVER_COMMAND}', and this edgesdk "
            f"({__version__}) has no '{SERVER_COMMAND}' command yet; nothing was deployed",
            "deploy without --service and start 'edgesdk run' on the board yourself until a server command exists")


def render_unit(edgesdk: str, current: str, user: str | None = None) -> str:
    """A systemd unit serving the bundle behind ``current`` (systemd quoting for the command line)."""
    command = " ".join(shlex.quote(part) for part in (edgesdk, SERVER_COMMAND, current))
    lines = ["[Unit]", "Description=edgesdk model server (deployed bundle)", "After=network-online.target", "",
             "[Service]", f"ExecStart={command}", "Restart=on-failure", "RestartSec=5"]
    if user:
        lines.append(f"User={user}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)
