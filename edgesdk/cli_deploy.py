"""The ``edgesdk deploy`` command (registered in :mod:`edgesdk.cli`).

Importing this module imports click only; the deploy machinery loads when the command runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("deploy")
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--host", "-H", metavar="USER@BOARD[:PORT]", help="Deploy over ssh to this board (or ~/.ssh/config alias).")
@click.option("--to", "to", type=click.Path(path_type=Path), help="Deploy into this local directory instead.")
@click.option("--remote-root", default="~/edgesdk", show_default=True, help="Deploy root on the board.")
@click.option("-i", "identity", type=click.Path(dir_okay=False), help="ssh private key (ssh -i).")
@click.option("--ssh-option", "-o", "ssh_options", multiple=True, metavar="OPT=VALUE",
              help="Extra ssh -o option (repeatable); yours take precedence over deploy's defaults.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="ssh config file (ssh -F) [~/.ssh/config].")
@click.option("--ssh-command", envvar="EDGESDK_SSH", help="ssh client command [$EDGESDK_SSH or 'ssh'].")
@click.option("--accept-new-host-key", is_flag=True,
              help="Store the board's host key on first contact (a changed key is still refused).")
@click.option("--status", "show_status", is_flag=True, help="Show the board's releases, current and runtime.")
@click.option("--rollback", is_flag=True, help="Switch current back to the previous release.")
@click.option("--release", "release_id", help="With --rollback: the release to switch to [previous].")
@click.option("--ignore-target", is_flag=True, help="Deploy a bundle built for another target anyway.")
@click.option("--no-install", is_flag=True, help="Do not install or update the edgesdk runtime on the board.")
@click.option("--runtime-venv-system-site-packages/--no-runtime-venv-system-site-packages", "system_site_packages",
              default=None, help="Let the runtime venv use Python packages already installed on the board "
                                 "(TensorRT bindings, onnxruntime-gpu); pip then installs only what is missing "
                                 "[on a Jetson, else off].")
@click.option("--remote-python", help="Python on the board [python3; this interpreter with --to].")
@click.option("--keep", default=3, show_default=True, help="Releases kept on the board (current and previous always).")
@click.option("--smoke-timeout", type=click.FloatRange(min=1), default=900.0, show_default=True, metavar="SECONDS",
              help="Seconds the smoke test ('edgesdk run' of the new release on the board, and of the release a "
                   "--rollback goes to) may take.")
@click.option("--service", is_flag=True,
              help="Install (or restart) a systemd unit that serves current with 'edgesdk serve --watch-thermal', "
                   "and wait for its /health; a user unit unless deploying as root.")
@click.option("--service-host", default="127.0.0.1", show_default=True,
              help="With --service: the address the server listens on (0.0.0.0 for the network).")
@click.option("--service-port", default=8080, show_default=True, type=click.IntRange(1, 65535),
              help="With --service: the server's TCP port.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def deploy(ctx, bundle, host, to, remote_root, identity, ssh_options, ssh_config, ssh_command, accept_new_host_key,
           show_status, rollback, release_id, ignore_target, no_install, system_site_packages, remote_python, keep,
           smoke_timeout, service, service_host, service_port, as_json):
    """Ship BUNDLE to a board over ssh and switch to it: verified, smoke-tested, atomic, with rollback.

    \b
      edgesdk deploy bundles/smollm2-135m-orin-nx-16gb --host nvidia@orin.local
      edgesdk deploy BUNDLE --to /mnt/sdcard/edgesdk        # same release logic, no ssh
      edgesdk deploy --status --host nvidia@orin.local
      edgesdk deploy --rollback --host nvidia@orin.local

    A cut connection leaves the board on its previous release; run the same command again to resume.
    """
    from edgesdk.deploy.orchestrate import Interrupted
    from edgesdk.deploy.transport import DeployError

    try:
        _deploy(ctx, bundle, host, to, remote_root, identity, ssh_options, ssh_config, ssh_command,
                accept_new_host_key, show_status, rollback, release_id, ignore_target, no_install,
                system_site_packages, remote_python, keep, smoke_timeout, service, service_host, service_port,
                as_json)
    except Interrupted as stop:  # Ctrl-C: say what the board was left with, exit as a shell reports SIGINT
        error = DeployError(stop.problem, stop.fix)
        error.exit_code = 130
        raise error from None


def _deploy(ctx, bundle, host, to, remote_root, identity, ssh_options, ssh_config, ssh_command, accept_new_host_key,
            show_status, rollback, release_id, ignore_target, no_install, system_site_packages, remote_python, keep,
            smoke_timeout, service, service_host, service_port, as_json):
    from edgesdk.deploy.session import DeployOptions
    from edgesdk.deploy.transport import DeployError, SshOptions

    if keep < 1:
        raise click.BadParameter("--keep must be at least 1", param_hint="--keep")
    if show_status and rollback:
        raise click.BadParameter("--status only shows the board's releases and --rollback switches current; "
                                 "pass one of them (--status after the rollback shows the result)",
                                 param_hint="--status/--rollback")
    if release_id is not None and not rollback:
        raise click.BadParameter("--release names the release to roll back to; pass --rollback with it",
                                 param_hint="--release")
    service_options = None
    if service:
        from edgesdk.deploy.service import ServiceOptions

        try:
            service_options = ServiceOptions(host=service_host, port=service_port)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--service-host") from exc
        if show_status or rollback:
            raise click.BadParameter("--service installs the unit with a deploy; a --rollback restarts a unit "
                                     "deploy installed by itself", param_hint="--service")
    else:
        source = click.core.ParameterSource.DEFAULT
        unused = [name for name in ("service_host", "service_port") if ctx.get_parameter_source(name) != source]
        if unused:
            raise click.BadParameter("works only with --service; add --service or drop it",
                                     param_hint=", ".join("--" + name.replace("_", "-") for name in unused))
    if to is not None and host is None:  # a local directory: no ssh, and --to is itself the deploy root
        typed = click.core.ParameterSource.COMMANDLINE  # $EDGESDK_SSH set for other deploys is no mistake
        unused = [flag for name, flag in (("remote_root", "--remote-root"), ("identity", "-i"),
                                          ("ssh_options", "--ssh-option"), ("ssh_config", "--ssh-config"),
                                          ("ssh_command", "--ssh-command"),
                                          ("accept_new_host_key", "--accept-new-host-key"))
                  if ctx.get_parameter_source(name) == typed]
        if unused:
            raise click.BadParameter(f"works only with --host: --to {to} deploys into that directory itself, "
                                     "without ssh; drop it, or deploy to a board with --host USER@BOARD",
                                     param_hint=", ".join(unused))
    options = DeployOptions(
        host=host, to=to, remote_root=remote_root, remote_python=remote_python, ignore_target=ignore_target,
        install=not no_install, system_site_packages=system_site_packages, keep=keep, smoke_timeout=smoke_timeout,
        service=service_options,
        ssh=SshOptions(identity=identity, ssh_config=ssh_config, options=tuple(ssh_options),
                       accept_new_host_key=accept_new_host_key, ssh_command=ssh_command))
    if show_status or rollback:
        if bundle is not None:
            raise DeployError(f"--status and --rollback take no BUNDLE (got {bundle})", "drop the bundle argument")
        from edgesdk.deploy.releases import format_status, status
        from edgesdk.deploy.releases import rollback as do_rollback

        if rollback:
            result = do_rollback(options, release_id)
            click.echo(json.dumps(result) if as_json else
                       f"rolled back {result['where']} ({result['root']}) from {result['from']} to {result['to']} "
                       f"in {result['seconds']:.1f} s")
        else:
            info = status(options)
            click.echo(json.dumps(info, indent=2) if as_json else format_status(info))
        return
    if bundle is None:
        raise DeployError("no BUNDLE given", "pass the bundle directory (or its archive from 'edgesdk pack') to deploy, "
                          "or --status / --rollback")
    from edgesdk.deploy.orchestrate import deploy as do_deploy

    result = do_deploy(bundle, options)
    click.echo(json.dumps(result.__dict__) if as_json else result.summary())
