"""The ``edgesdk deploy`` command (registered in :mod:`edgesdk.cli`).

Importing this module imports click only; the deploy machinery loads when the command runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgesdk.cli_options import NamedPath
from edgesdk.cli_thermal import FiniteRange

# A finite number of seconds up to a week: click's FloatRange lets nan and inf through, which end the deploy in
# Python's ValueError / OverflowError once the bundle is on the board (subprocess's timeout, the board-side
# deadline's round()), as does a timeout past what poll() takes (about 24.8 days: "timeout is too large").
SMOKE_TIMEOUT = FiniteRange(1, 7 * 24 * 3600.0, what="seconds the smoke test may take", example="900")


@click.command("deploy")
@click.argument("bundle", required=False, type=click.Path(path_type=Path))
@click.option("--host", "-H", multiple=True, metavar="USER@BOARD[:PORT]",
              help="Deploy over ssh to this board (or ~/.ssh/config alias); repeat it for several boards.")
@click.option("--port", "-p", "port", type=click.IntRange(1, 65535), metavar="N",
              help="With one --host: the board's ssh port (ssh -p), as USER@BOARD:PORT gives it; the server's "
                   "port is --service-port.")
@click.option("--hosts", "hosts_file", type=NamedPath("inventory file", "--hosts boards.txt", dir_okay=False),
              metavar="FILE",
              help="Deploy to every board of this inventory: one USER@BOARD[:PORT] (or alias) per line, optionally "
                   "followed by remote_root=, remote_python=, identity= for that board; # starts a comment.")
@click.option("--limit", multiple=True, metavar="BOARD",
              help="With --hosts: only the inventory's boards named here (repeatable), as the line starts.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=4, show_default=True, metavar="N",
              help="With several boards: how many are deployed at once. Each sends the bundle from this machine "
                   "and checks its sha256 here, so more at once share this machine's uplink and disk without "
                   "finishing sooner; raise it for small bundles on a fast network.")
@click.option("--fail-fast", is_flag=True,
              help="With several boards: start no further board after the first failure (running ones finish).")
@click.option("--to", "to", type=NamedPath("directory to deploy into", "--to /mnt/sdcard/edgesdk, or --to . for "
                                                                        "this one"),
              help="Deploy into this local directory instead.")
@click.option("--remote-root", default="~/edgesdk", show_default=True, help="Deploy root on the board.")
@click.option("-i", "identity", type=click.Path(dir_okay=False), help="ssh private key (ssh -i).")
@click.option("--ssh-option", "-o", "ssh_options", multiple=True, metavar="OPT=VALUE",
              help="Extra ssh -o option (repeatable); yours take precedence over deploy's defaults.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="ssh config file (ssh -F) [~/.ssh/config].")
@click.option("--ssh-command", envvar="EDGESDK_SSH", help="ssh client command [$EDGESDK_SSH or 'ssh'].")
@click.option("--accept-new-host-key", is_flag=True,
              help="Store the board's host key on first contact (a changed key is still refused).")
@click.option("--status", "show_status", is_flag=True, help="Show the board's releases, current and runtime, and the --service unit: enabled and "
                   "active, and the model, backend and release its server runs.")
@click.option("--rollback", is_flag=True, help="Switch current back to the previous release.")
@click.option("--release", "release_id",
              help="With --rollback: the release to switch to, by its id or the start of one [previous].")
@click.option("--remove", "remove_id", metavar="ID",
              help="Remove this release from the board (its id, or the start of one, as --status lists it), with its "
                   "engines and the runtime only it ran with; current is refused.")
@click.option("--ignore-target", is_flag=True, help="Deploy a bundle built for another target anyway.")
@click.option("--no-install", is_flag=True, help="Do not install or update the edgesdk runtime on the board.")
@click.option("--runtime-venv-system-site-packages/--no-runtime-venv-system-site-packages", "system_site_packages",
              default=None, help="Let the runtime venv use Python packages already installed on the board "
                                 "(TensorRT bindings, onnxruntime-gpu); pip then installs only what is missing "
                                 "[on a Jetson, else off].")
@click.option("--remote-python", help="Python on the board [python3; this interpreter with --to].")
@click.option("--keep", default=3, show_default=True, help="Releases kept on the board (current and previous always).")
@click.option("--smoke-timeout", type=SMOKE_TIMEOUT, default=900.0, show_default=True, metavar="SECONDS",
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
def deploy(ctx, bundle, host, port, hosts_file, limit, jobs, fail_fast, to, remote_root, identity, ssh_options,
           ssh_config, ssh_command, accept_new_host_key, show_status, rollback, release_id, remove_id, ignore_target,
           no_install, system_site_packages, remote_python, keep, smoke_timeout, service, service_host, service_port, as_json):
    """Ship BUNDLE to a board over ssh and switch to it: verified, smoke-tested, atomic, with rollback.

    \b
      edgesdk deploy bundles/smollm2-135m-orin-nx-16gb --host nvidia@orin.local
      edgesdk deploy BUNDLE --to /mnt/sdcard/edgesdk        # same release logic, no ssh
      edgesdk deploy --status --host nvidia@orin.local
      edgesdk deploy --rollback --host nvidia@orin.local
      edgesdk deploy --remove 3f2a --host nvidia@orin.local # one old release, by (the start of) its id
      edgesdk deploy BUNDLE --hosts boards.txt --jobs 8     # a fleet: concurrent, one summary

    A cut connection leaves the board on its previous release; run the same command again to resume.
    """
    from edgesdk.deploy.orchestrate import Interrupted
    from edgesdk.deploy.transport import DeployError

    try:
        _deploy(ctx, bundle, host, port, hosts_file, limit, jobs, fail_fast, to, remote_root, identity, ssh_options,
                ssh_config, ssh_command, accept_new_host_key, show_status, rollback, release_id, remove_id,
                ignore_target, no_install, system_site_packages, remote_python, keep, smoke_timeout, service,
                service_host, service_port, as_json)
    except Interrupted as stop:  # Ctrl-C: say what the board was left with, exit as a shell reports SIGINT
        error = DeployError(stop.problem, stop.fix)
        error.exit_code = 130
        raise error from None


def _deploy(ctx, bundle, host, port, hosts_file, limit, jobs, fail_fast, to, remote_root, identity, ssh_options,
            ssh_config, ssh_command, accept_new_host_key, show_status, rollback, release_id, remove_id, ignore_target,
            no_install, system_site_packages, remote_python, keep, smoke_timeout, service, service_host, service_port,
            as_json):
    from edgesdk.deploy.session import DeployOptions
    from edgesdk.deploy.transport import DeployError, SshOptions

    fleet = hosts_file is not None or len(host) > 1
    if fleet and to is not None:
        given = f"--hosts {hosts_file}" if hosts_file else f"--host given {len(host)} times"
        raise click.BadParameter(f"deploys into one local directory, so it takes no fleet ({given}); drop --to to "
                                 "deploy to the boards, or the boards to deploy into the directory", param_hint="--to")
    if limit and hosts_file is None:
        raise click.BadParameter("picks boards of an inventory; pass --hosts FILE with it, or name the boards with "
                                 "--host", param_hint="--limit")
    if port is not None and fleet:
        given = f"--hosts {hosts_file}" if hosts_file else f"--host given {len(host)} times"
        raise click.BadParameter(f"{port} is the ssh port of one board, and this deploy goes to a fleet ({given}), "
                                 "whose boards each take their own port: put it after the board on its --host or "
                                 "inventory line (pi@board:2222; an ~/.ssh/config alias takes its Port from there), "
                                 "and drop -p", param_hint="-p/--port")
    host = host[0] if host and not fleet else None
    if port is not None and host is not None:
        host = with_port(host, port)
    if keep < 1:
        raise click.BadParameter(f"{keep}: the releases kept on the board must number at least 1 (current and "
                                 "previous are kept whatever it says); pass --keep 1 or more", param_hint="--keep")
    if show_status and rollback:
        raise click.BadParameter("--status only shows the board's releases and --rollback switches current; "
                                 "pass one of them (--status after the rollback shows the result)",
                                 param_hint="--status/--rollback")
    if remove_id is not None:
        given = [flag for flag, on in (("--status", show_status), ("--rollback", rollback), ("--service", service))
                 if on]
        if given:
            raise click.BadParameter(f"removes one release and nothing else; drop {' and '.join(given)} (run it on "
                                     "its own before or after --remove)", param_hint="--remove")
        if fleet:
            raise click.BadParameter(f"removes {remove_id} from one board: pass one --host (or --to DIR), and run it "
                                     "again for each board", param_hint="--remove")
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
            does = ("--status only shows the board's releases" if show_status else
                    "--rollback restarts a unit that a deploy installed by itself")
            raise click.BadParameter(f"installs (or restarts) the unit with a deploy of a BUNDLE, and {does}; drop "
                                     "--service", param_hint="--service")
    else:
        source = click.core.ParameterSource.DEFAULT
        unused = [name for name in ("service_host", "service_port") if ctx.get_parameter_source(name) != source]
        if unused:
            # --status, --rollback and --remove refuse --service too: there, adding it is no fix
            fix = "drop it" if show_status or rollback or remove_id is not None else "add --service or drop it"
            raise click.BadParameter(f"works only with --service; {fix}",
                                     param_hint=", ".join("--" + name.replace("_", "-") for name in unused))
    _warn_unused(ctx, fleet, show_status, rollback, remove_id is not None)
    if to is not None and host is None:  # a local directory: no ssh, and --to is itself the deploy root
        typed = click.core.ParameterSource.COMMANDLINE  # $EDGESDK_SSH set for other deploys is no mistake
        unused = [flag for name, flag in (("port", "-p/--port"), ("remote_root", "--remote-root"),
                                          ("identity", "-i"), ("ssh_options", "--ssh-option"),
                                          ("ssh_config", "--ssh-config"), ("ssh_command", "--ssh-command"),
                                          ("accept_new_host_key", "--accept-new-host-key"))
                  if ctx.get_parameter_source(name) == typed]
        if unused:
            raise click.BadParameter(f"works only with --host: --to {to} deploys into that directory itself, "
                                     "without ssh; drop it, or deploy to a board with --host USER@BOARD",
                                     param_hint=", ".join(unused))
    options = DeployOptions(
        host=host, to=to, remote_root=remote_root, remote_python=remote_python, ignore_target=ignore_target,
        remote_root_source=None if ctx.get_parameter_source("remote_root") in (None, click.core.ParameterSource.DEFAULT)
        else "--remote-root",
        install=not no_install, system_site_packages=system_site_packages, keep=keep, smoke_timeout=smoke_timeout,
        service=service_options,
        ssh=SshOptions(identity=identity, ssh_config=ssh_config, options=tuple(ssh_options),
                       accept_new_host_key=accept_new_host_key, ssh_command=ssh_command))
    wrong = None
    if show_status or rollback or remove_id is not None:
        if bundle is not None:
            wrong = DeployError(f"--status, --rollback and --remove take no BUNDLE (got {bundle})",
                                "drop the bundle argument")
    elif bundle is None:
        wrong = DeployError("no BUNDLE given", "pass the bundle directory (or its archive from 'edgesdk pack') to "
                            "deploy, or --status / --rollback / --remove ID")
    if wrong is not None:
        if as_json:  # the object a script reads, as one_board prints it for a board that failed
            _print_failures(wrong, options, _action_keys(show_status, rollback, remove_id is not None),
                            (lambda: fleet_boards(options, host_args(ctx), hosts_file, limit)) if fleet else None,
                            indent=2 if show_status else None, refused=True)
        raise wrong
    if fleet:
        _fleet(ctx, bundle, options, host_args(ctx), hosts_file, limit, jobs, fail_fast, show_status, rollback,
               release_id, as_json)
        return
    if remove_id is not None:
        from edgesdk.deploy.releases import REMOVE_KEYS, remove

        result = one_board(options, as_json, REMOVE_KEYS,
                           lambda progress: remove(options, remove_id, warn=lambda line: click.echo(line, err=True)),
                           release=lambda result: _current_release(options))  # one_board asks it for --json only
        runtime = (f", and the edgesdk runtime {result['runtime_removed']} only it ran with"
                   if result["runtime_removed"] else "")
        for failed in result["failed"]:
            click.echo(f"warning: the board's {failed['path']} could not be removed ({failed['error']}): remove it by "
                       "hand on the board", err=True)
        if not as_json:  # one_board printed the object
            click.echo(f"removed releases/{result['removed']}{runtime} from {result['where']}")
        return
    if show_status or rollback:
        from edgesdk.deploy.releases import ROLLBACK_KEYS, STATUS_KEYS, format_status, status
        from edgesdk.deploy.releases import rollback as do_rollback

        if rollback:
            result = one_board(options, as_json, ROLLBACK_KEYS,
                               lambda progress: do_rollback(options, release_id, progress=progress),
                               release=lambda result: result["to"])
            runtime = (f" with the runtime {result['runtime']} it ran with (was {result['runtime_from'] or 'none'})"
                       if result.get("runtime") else "")
            where = result["where"] if result["where"].endswith(result["root"]) else \
                f"{result['where']} ({result['root']})"  # --to DIR: once
            if not as_json:
                click.echo(f"rolled back {where} from {result['from']} to {result['to']}{runtime} in "
                           f"{result['seconds']:.1f} s")
        else:
            from edgesdk.deploy.fleet import RELEASE_NONE

            info = one_board(options, as_json, STATUS_KEYS, lambda progress: status(options), indent=2,
                             release=lambda info: info.get("current") or RELEASE_NONE)
            if not as_json:
                click.echo(format_status(info))
        return
    from dataclasses import fields

    from edgesdk.deploy.orchestrate import DeployResult
    from edgesdk.deploy.orchestrate import deploy as do_deploy

    result = one_board(options, as_json, [item.name for item in fields(DeployResult)],
                       lambda progress: do_deploy(bundle, options, progress=progress),
                       release=lambda result: result["bundle_id"])
    if not as_json:
        click.echo(result.summary())


def _current_release(options) -> str | None:
    """The release the board of ``options`` is on, asked of it (--remove --json's ``release``: a removal never
    touches current, and its result does not name it): "none" for no release, None where the board no longer
    answers, as a fleet's entry gives a release it does not know, where the removal itself succeeded."""
    from edgesdk.deploy.fleet import RELEASE_NONE
    from edgesdk.deploy.releases import status
    from edgesdk.errors import EdgeSDKError

    try:
        return status(options).get("current") or RELEASE_NONE
    except EdgeSDKError:
        return None


def one_board(options, as_json: bool, keys, action, indent: int | None = None, release=None):
    """``action(progress)`` for the one board (or --to directory) of ``options``, returning its result. With
    ``--json`` the board's object is printed either way, with the keys a fleet's entry has (:meth:`Outcome.as_json
    <edgesdk.deploy.fleet.Outcome.as_json>`), so a script reads ``ok`` and ``state`` of one board as of a fleet's:
    on success the result's keys with ``ok`` true, ``state`` "ok", ``error`` and ``fix`` null, ``host``,
    ``remote_root`` and ``release`` (``release(result)``, the release the board is on); where it fails, before the
    error goes on to stderr and the exit status, ``keys`` null, ``ok`` false, ``state``, ``error``, ``fix``,
    ``refused`` and ``release`` where known. Printed on success only, the failure's keys made a script test which
    of the two shapes it got."""
    import time

    from edgesdk.deploy import fleet
    from edgesdk.errors import EdgeSDKError

    progress: dict = {}
    began = time.monotonic()
    try:
        result = action(progress)
    except (EdgeSDKError, KeyboardInterrupt) as error:
        if as_json:
            _print_failures(error, options, keys, indent=indent, seconds=time.monotonic() - began,
                            release=fleet.left_on(progress), refused=bool(progress.get("refused")))
        raise
    if as_json:
        entry = result if isinstance(result, dict) else dict(result.__dict__)
        outcome = fleet.Outcome(json_board(options), state=fleet.OK, seconds=time.monotonic() - began,
                                result=entry, release=release(entry) if release else None)
        click.echo(json.dumps(outcome.as_json(keys), indent=indent))
    return result


def json_board(options):
    """The board of a single-board ``--json`` object: ``host`` the --host given (null for --to), ``remote_root``
    the deploy root as given (--remote-root, or the --to directory), null where neither --host nor --to was."""
    from edgesdk.deploy import fleet

    root = options.remote_root if options.host else str(options.to) if options.to is not None else None
    return fleet.FleetBoard(host=options.host, root=root)


def _action_keys(show_status: bool, rollback: bool, removing: bool) -> list[str]:
    """The result keys of what was asked: a status's, a rollback's, a removal's or a deploy's."""
    from edgesdk.deploy.releases import REMOVE_KEYS, ROLLBACK_KEYS, STATUS_KEYS

    if show_status or rollback or removing:
        return list(STATUS_KEYS if show_status else ROLLBACK_KEYS if rollback else REMOVE_KEYS)
    from dataclasses import fields

    from edgesdk.deploy.orchestrate import DeployResult

    return [item.name for item in fields(DeployResult)]


def _print_failures(error, options, keys, boards=None, indent: int | None = None, seconds: float | None = None,
                    release: str | None = None, refused: bool = False) -> None:
    """The ``--json`` of a command that failed: the one board's object, or (``boards``, a callable giving a
    fleet's boards) a list with one per board, each with ``ok`` false, the error and its fix. A board that none of
    it reached is "not started"; ``refused`` where running the same command again fails the same way (a bundle
    error, or a usage error: nothing a retry changes). A fleet whose boards cannot be listed (a bad inventory)
    prints nothing: its error names the inventory."""
    from edgesdk.deploy import fleet
    from edgesdk.errors import BundleError, EdgeSDKError

    interrupted = isinstance(error, KeyboardInterrupt)
    state = fleet.INTERRUPTED if interrupted else fleet.FAILED
    fix = getattr(error, "fix", None) or (None if isinstance(error, EdgeSDKError) else "run the same command again")
    problem = getattr(error, "problem", None) or "interrupted (Ctrl-C)"
    refused = refused or isinstance(error, BundleError)
    if boards is None:
        outcome = fleet.Outcome(json_board(options), state=state, seconds=seconds, problem=problem, fix=fix,
                                release=release, refused=refused)
        click.echo(json.dumps(outcome.as_json(keys), indent=indent))
        return
    try:
        listed = boards()
    except EdgeSDKError:
        return
    outcomes = [fleet.Outcome(board, state=fleet.NOT_STARTED, problem=problem, fix=fix, refused=refused)
                for board in listed]
    click.echo(json.dumps(fleet.json_entries(outcomes, keys), indent=indent))


def fleet_boards(options, hosts, hosts_file, limit):
    """The fleet's boards, as :func:`edgesdk.deploy.fleet.fleet_boards` lists them from --host and --hosts."""
    from edgesdk.deploy import fleet

    return fleet.fleet_boards(hosts, hosts_file, limit, options.remote_root)


def with_port(host: str, port: int) -> str:
    """``--host`` ``host`` with the ssh port of ``-p port``; a port in ``host`` too must be the same one."""
    from dataclasses import replace

    from edgesdk.deploy.transport import HostSpec

    spec = HostSpec.parse(host)
    if spec.port is not None and spec.port != port:
        raise click.BadParameter(f"port {port}, and --host {host} gives port {spec.port}: give the board's ssh port "
                                 f"once, --host {replace(spec, port=None)} -p {port} or --host {host}",
                                 param_hint="-p/--port")
    return str(replace(spec, port=port))


def _warn_unused(ctx, fleet: bool, show_status: bool, rollback: bool, removing: bool = False) -> None:
    """Name the options typed on the command line that this deploy does not use, as ``run`` names an unused
    --top-p: --jobs and --fail-fast beside a single board; what only a deploy of a BUNDLE uses (pruning to --keep,
    the runtime's install, and for --status and --remove the smoke test and the target check) beside --status,
    --rollback or --remove, which ship no bundle."""
    typed = click.core.ParameterSource.COMMANDLINE
    unused = []
    if not fleet:
        unused += [(flag, "it works with several boards (--host repeated, or --hosts FILE)")
                   for name, flag in (("jobs", "--jobs"), ("fail_fast", "--fail-fast"))
                   if ctx.get_parameter_source(name) == typed]
    if show_status or rollback or removing:
        mode = "--status" if show_status else "--rollback" if rollback else "--remove"
        options = [("keep", "--keep"), ("no_install", "--no-install"),
                   ("system_site_packages", "--[no-]runtime-venv-system-site-packages")]
        if show_status or removing:  # a rollback smoke-tests the release it goes to, checking its target
            options += [("smoke_timeout", "--smoke-timeout"), ("ignore_target", "--ignore-target")]
        unused += [(flag, f"it works with a deploy of a BUNDLE, not {mode}") for name, flag in options
                   if ctx.get_parameter_source(name) == typed]
    for flag, why in unused:
        click.echo(f"edgesdk deploy: {flag} is not used: {why}", err=True)


def host_args(ctx) -> tuple[str, ...]:
    """The --host values as given (``_deploy`` reduces ``host`` to one board or None)."""
    return tuple(ctx.params.get("host") or ())


def command_words(ctx, leave_out: tuple[str, ...]) -> list[str]:
    """``edgesdk deploy`` with the arguments and options given on the command line, less ``leave_out``
    (parameter names): the command to run again. Options from the environment ($EDGESDK_SSH) stay there."""
    typed = click.core.ParameterSource.COMMANDLINE
    words = ["edgesdk", "deploy"]
    for param in ctx.command.params:
        if param.name in leave_out or ctx.get_parameter_source(param.name) != typed:
            continue
        value = ctx.params[param.name]
        if isinstance(param, click.Argument):
            words.append(str(value))
        elif param.is_flag:
            words.append(max(param.opts if value or not param.secondary_opts else param.secondary_opts, key=len))
        else:
            for one in value if param.multiple else (value,):
                words += [max(param.opts, key=len), str(one)]
    return words


def _fleet(ctx, bundle, options, hosts, hosts_file, limit, jobs, fail_fast, show_status, rollback, release_id,
           as_json):
    """Deploy (roll back, show the status of) every board of ``--host`` and ``--hosts`` (edgesdk/deploy/fleet.py).

    The bundle is verified (an archive unpacked) once, here, before any board is contacted: a bundle that fails
    verification, or a path that is none, ends the command with the bundle's error and its exit status (5), not
    with one failure per board and a retry line that could only fail again."""
    import contextlib

    with contextlib.ExitStack() as stack:  # an unpacked archive's temporary directory lasts until the boards finish
        _fleet_run(ctx, bundle, options, hosts, hosts_file, limit, jobs, fail_fast, show_status, rollback,
                   release_id, as_json, stack)


def _fleet_run(ctx, bundle, options, hosts, hosts_file, limit, jobs, fail_fast, show_status, rollback, release_id,
               as_json, stack):
    import shlex
    import time
    from dataclasses import fields, replace

    from edgesdk.deploy import fleet
    from edgesdk.deploy.report import Reporter

    boards = fleet.fleet_boards(hosts, hosts_file, limit, options.remote_root)
    if options.service is not None:
        fleet.one_service_per_board(boards, options.service.port)
    console = fleet.Console()
    on_interrupt = None
    if show_status:
        from edgesdk.deploy.releases import STATUS_KEYS, format_status, status

        # in a fleet's --json every board's object carries the keys of a board's result, null for a board that did
        # not finish (a deploy's: DeployResult's fields)
        what, keys = "status", STATUS_KEYS

        def work(board, report, progress):
            info = status(fleet.board_options(options, board))
            return info, info.get("current") or fleet.RELEASE_NONE

        def make_report(board):
            return None
    elif rollback:
        from edgesdk.deploy.releases import ROLLBACK_KEYS
        from edgesdk.deploy.releases import rollback as do_rollback  # the option's name is rollback

        what, keys = "rollback", ROLLBACK_KEYS

        def work(board, report, progress):
            source = options.remote_root_source if board.remote_root is None else f"remote_root= in {hosts_file}"
            board_options = replace(fleet.board_options(options, board), remote_root_source=source)
            result = do_rollback(board_options, release_id, report, progress)
            return result, result["to"]

        def make_report(board):
            return Reporter(total=4, prefix="rollback", write=console.board_writer(board.label))
    else:
        from edgesdk.bundle import verify_bundle
        from edgesdk.deploy.orchestrate import DeployResult, interrupted
        from edgesdk.deploy.orchestrate import deploy as do_deploy
        from edgesdk.deploy.session import unpack_if_archive
        from edgesdk.errors import EdgeSDKError

        try:
            verified = verify_bundle(unpack_if_archive(Path(bundle), stack))
        except EdgeSDKError as error:  # no board is contacted; --json still gets one object per board
            if as_json:
                _print_failures(error, options, [item.name for item in fields(DeployResult)], lambda: boards)
            raise
        console.line(f"bundle {bundle}: {verified.bundle_id}, target {verified.target}, verified on this machine; "
                     f"deploying to {fleet.boards_count(len(boards))}")
        what, keys = "deploy", [item.name for item in fields(DeployResult)]
        # no runtime wheel up front: the first board whose probe finds it lacks the runtime builds it, the boards
        # that need it meanwhile wait for that build (install.build_wheel), and a fleet whose boards all have it
        # builds none

        def work(board, report, progress):
            result = do_deploy(bundle, fleet.board_options(options, board), report, progress, verified=verified)
            return result.__dict__, result.bundle_id

        def make_report(board):
            return Reporter(total=9 if options.service else 8, write=console.board_writer(board.label))

        def on_interrupt(progress, error):
            said = interrupted(progress)
            last = getattr(error, "problem", None) or str(error)
            if fleet.first_line(last):
                said.problem += f"\n(the board's last answer: {fleet.first_line(last)})"
            return said

    began = time.monotonic()
    outcomes, stopped = fleet.run_fleet(boards, work, make_report, console, jobs=jobs, fail_fast=fail_fast,
                                        on_interrupt=on_interrupt)
    lines = fleet.summary(what, outcomes, time.monotonic() - began,
                          changed=fleet.deploy_changed if what == "deploy" else None)
    again, refused = fleet.retry_boards(outcomes), fleet.refused_boards(outcomes)
    if again:
        words = command_words(ctx, ("host", "hosts_file", "limit")) + fleet.retry_arguments(again)
        lines.append(f"retry the {len(again)} board{'s' if len(again) > 1 else ''} that did not finish: "
                     + shlex.join(words))
    if refused:  # the same command fails there again: left out of the retry, named with their own fix
        words = command_words(ctx, ("host", "hosts_file", "limit")) + fleet.retry_arguments(refused)
        lines.append(f"after the fix its error gives, run the {what} again on the {fleet.boards_count(len(refused))} "
                     "that refused it (the same command fails there the same way): " + shlex.join(words))
    if as_json:
        click.echo(json.dumps(fleet.json_entries(outcomes, keys), indent=2 if show_status else None))
    elif show_status:
        blocks = [fleet.status_block(o, format_status) for o in outcomes]
        click.echo("\n\n".join(blocks))
    for line in lines:
        click.echo(line, err=as_json or show_status)
    ctx.exit(130 if stopped else 0 if all(o.state == fleet.OK for o in outcomes) else 1)
