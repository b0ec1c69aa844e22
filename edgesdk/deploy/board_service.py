"""The board side of deploy, part 4 of 5: the systemd unit that serves ``current`` (``deploy --service``).

A deploy user that is root gets a system unit (``/etc/systemd/system``, started at boot); any other
user gets a user unit (``~/.config/systemd/user``), which starts at boot only while the user lingers
(``loginctl enable-linger``): that is turned on here where logind allows it, and reported where it
does not. The unit runs ``edgesdk serve <root>/current``; ``current`` is a link, so one unit outlives
every redeploy and rollback, and the restart after each switch serves the new release. A service
counts as up once its ``/health`` answers 200. (systemd.service(5) "Command lines", systemd.unit(5),
loginctl(1).)
"""

import contextlib
import getpass
import http.client
import ipaddress
import json
import os
import shlex
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

if "BOARD_BUNDLED" not in globals():  # on the host; on the board the parts are concatenated
    from edgesdk.deploy.board_common import Lock, Refused, fsync_dir, paths, run_quiet

SERVICE_NAME = "edgesdk-serve"
SERVICE_RECORD = "service.json"  # under the deploy root: the installed unit's scope, path and /health URL
# Under the deploy root while an install is in flight: the unit file, record and state before it, so a
# deploy whose service does not come up puts them back ("revert") and the server that ran before runs again.
# It carries the deploy's token: a file left by a killed deploy, or written by a concurrent one, is not this
# deploy's to put back or remove.
SERVICE_BEFORE = "service.before.json"
HEALTH_POLL_S = 0.5
BINDV6ONLY = "/proc/sys/net/ipv6/bindv6only"  # net.ipv6.bindv6only: 0 (the default) binds :: to IPv4 too
JOURNAL_LINES = 15


def unit_scope():
    """"system" for root, else "user"."""
    return "system" if os.geteuid() == 0 else "user"


def unit_path(scope):
    """The unit file: ``$EDGESDK_UNIT_DIR`` when set (a board whose units live elsewhere), else systemd's
    directory for administrator units of that scope (systemd.unit(5), "Unit File Load Path")."""
    folder = os.environ.get("EDGESDK_UNIT_DIR")
    if not folder and scope == "system":
        folder = "/etc/systemd/system"
    elif not folder:
        config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        folder = os.path.join(config, "systemd", "user")
    return os.path.join(folder, SERVICE_NAME + ".service")


def unit_dir_refusal(scope, path, command):
    """A refusal where the unit file ``path`` cannot be written (None where it can), asked before anything changes:
    its directory, or the nearest of its parents that exists, is to be a directory this user may write, on a file
    system mounted read-write. A user whose home does not exist (or is not theirs: ``/nonexistent``, a system
    account's) has no ``~/.config/systemd/user`` to write, which the user manager reads its units from
    (systemd.unit(5) "Unit File Load Path"); a board whose root file system is read-only has no writable
    ``/etc/systemd/system``. Found only at the install, after ``current`` was switched, it was told as a fault of
    the deploy root."""
    folder = existing = os.path.dirname(path)
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        why = f"{existing} is not a directory"
    elif read_only(existing):
        why = f"{existing} is on a file system mounted read-only"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"{existing} is not writable by {getpass.getuser()}"
    else:
        return None
    if os.environ.get("EDGESDK_UNIT_DIR"):
        fix = (f"set EDGESDK_UNIT_DIR on the board to a directory that {getpass.getuser()} can write and systemd reads "
               "units from, or unset it")
    elif scope == "user":
        fix = (f"give {getpass.getuser()} a home directory it can write (the user manager reads its units from "
               f"{folder}), or deploy as root for a system unit")
    else:
        fix = (f"make {folder} writable (a read-only root file system: sudo mount -o remount,rw /), or deploy without "
               f"--service and start the server yourself: {command}")
    return Refused(f"the {scope} unit {path} cannot be written: {why}", fix)


def read_only(folder):
    """Whether ``folder`` lies on a file system mounted read-only (statvfs(3) ST_RDONLY), as root too."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def systemd_quote(argument):
    """One ExecStart argument: double-quoted with C escapes, ``%`` and ``$`` doubled so systemd reads
    neither a specifier nor a variable (systemd.service(5), "Command lines")."""
    if "\n" in argument or "\r" in argument:
        raise Refused(f"the service command line holds a line break: {argument!r}",
                      "deploy into a root whose path has no line break (--remote-root)")
    quoted = argument.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return '"' + quoted + '"'


# What systemd refuses in the program of a command line: quotes, backslashes and control characters
# (src/basic/string-util.c string_is_safe, checked by src/core/load-fragment.c config_parse_exec).
UNSAFE_IN_PROGRAM = "\"'\\\x7f"


def systemd_program(path):
    """ExecStart's first word, the program: double-quoted with ``%`` doubled, as systemd expands specifiers in
    it, but ``$`` left alone, as it substitutes variables only in the arguments (a ``$$`` there would name a
    file that does not exist). systemd refuses a program path holding a quote, an apostrophe, a backslash or a
    control character ("Executable name contains special characters", a fatal unit error), so that is refused
    here, before the unit is written (systemd.service(5) "Command lines"; config_parse_exec)."""
    unsafe = sorted({c for c in path if c in UNSAFE_IN_PROGRAM or c < " "})
    if unsafe or not path.startswith("/"):
        why = (f"holds {', '.join(repr(c) for c in unsafe)}, which systemd refuses in the program of a unit's "
               "ExecStart (\"Executable name contains special characters\")" if unsafe else
               "is not an absolute path (for a unit's ExecStart systemd refuses a relative one and looks a bare "
               "name up in its own search path, not where the deploy's ssh session found it)")
        # The program is the runtime deploy installs under the deploy root, the edgesdk on the board's PATH
        # (--no-install), or for --to DIR the Python running deploy (install.runtime_argv, session.board_edgesdk).
        fix = ("put the program under a path with no quote, apostrophe, backslash or control character: deploy "
               "into such a --remote-root (the runtime deploy installs lies under it); with --no-install, install "
               "edgesdk on the board under such a path; with --to DIR, run deploy with a Python installed under "
               "such a path (the unit runs that one)") if unsafe else \
            ("with --no-install, name edgesdk on the board's PATH by an absolute directory (ssh sessions' PATH "
             "holds a relative one), or deploy without --no-install: it installs the runtime under the deploy root")
        raise Refused(f"the service's program {path!r} {why}", fix + "; then deploy with --service again")
    return '"' + path.replace("%", "%%") + '"'


# A server that keeps exiting (a broken bundle, a port taken after the deploy) is started at most START_LIMIT_BURST
# times in START_LIMIT_INTERVAL_S, then left failed. systemd's defaults (5 starts in 10 s: DefaultStartLimitBurst=,
# DefaultStartLimitIntervalSec=) never trip with RestartSec=5, so the unit restarted every 5 s for ever
# (systemd.unit(5) "StartLimitIntervalSec=, StartLimitBurst=").
RESTART_SEC = 5
START_LIMIT_BURST = 5
START_LIMIT_INTERVAL_S = 300


def render_unit(argv, scope):
    """The unit file text for ``argv`` (the serve command line)."""
    command = " ".join([systemd_program(argv[0]), *(systemd_quote(a) for a in argv[1:])])
    lines = ["[Unit]", "Description=edgesdk model server (the deployed bundle behind current)",
             "After=network-online.target", "Wants=network-online.target",
             f"StartLimitIntervalSec={START_LIMIT_INTERVAL_S}", f"StartLimitBurst={START_LIMIT_BURST}", "",
             "[Service]", "Type=simple", f"ExecStart={command}",
             # always: a server ended by a SIGTERM or SIGHUP that was no 'systemctl stop' (a stray kill, an OOM
             # helper) exits 143 / 129, which counts as success below, and on-failure left it down; systemd restarts
             # no unit that systemctl stopped, under any Restart= (systemd.service(5) "Restart="), as Ollama's unit
             # does it. A server that keeps exiting still meets the start limit above.
             "Restart=always", f"RestartSec={RESTART_SEC}",
             # serve ends SIGTERM / SIGHUP with exit 128 + the signal once its answers and thermal session are
             # closed; without this a 'systemctl stop' would leave the unit failed (systemd.service(5)).
             "SuccessExitStatus=143 129", "",
             "[Install]", f"WantedBy={'multi-user.target' if scope == 'system' else 'default.target'}", ""]
    return "\n".join(lines)


# Where pam_systemd puts a user's XDG_RUNTIME_DIR, /run/user/$UID: the user manager listens there while it runs
# (pam_systemd(8), user@.service(5)).
USER_RUNTIME_ROOT = "/run/user"


def find_user_manager():
    """Point XDG_RUNTIME_DIR, which ``systemctl --user`` finds the user manager by, at this user's runtime directory
    where it is unset or names no directory of this user's, and that directory exists. Only a login through
    pam_systemd sets it: a deploy run from a service (a CI runner on the board), through ``su`` or ``sudo -u``, or
    over an ssh server without PAM (dropbear, UsePAM no) has none, or another user's, and ``systemctl --user``
    failed with "Failed to connect to bus" while the user's manager ran (a lingering user's does)."""
    given = os.environ.get("XDG_RUNTIME_DIR", "")
    if given and owned_directory(given):
        return
    runtime = os.path.join(USER_RUNTIME_ROOT, str(os.geteuid()))
    if owned_directory(runtime):
        os.environ["XDG_RUNTIME_DIR"] = runtime


def owned_directory(path):
    """Whether ``path`` is a directory that this user owns."""
    try:
        facts = os.stat(path)
    except (OSError, ValueError):
        return False
    return facts.st_mode & 0o170000 == 0o040000 and facts.st_uid == os.geteuid()  # S_IFDIR


def systemctl(scope, *args, timeout=120):
    if scope == "user":
        find_user_manager()
    return run_quiet(["systemctl", *(["--user"] if scope == "user" else []), *args], timeout=timeout)


def restart_unit(scope):
    """``systemctl restart`` the unit, its start limit cleared first: a unit that hit it (its server kept exiting)
    refuses every start, a deploy's or rollback's too, with "Start request repeated too quickly" until
    ``reset-failed`` (systemd.unit(5) "StartLimitIntervalSec="; systemctl(1) "reset-failed"). A unit that has not
    failed has nothing to reset, and a reset that fails is no reason not to try the restart."""
    systemctl(scope, "reset-failed", SERVICE_NAME, timeout=30)
    return systemctl(scope, "restart", SERVICE_NAME)


def journal_lines(*select):
    """The unit's last JOURNAL_LINES lines as ``journalctl SELECT`` finds them ("" where none). ``-q`` keeps
    "-- No entries --" and the hint about unreadable journals out of them (journalctl(1) "--quiet")."""
    code, out = run_quiet(["journalctl", "-q", *select, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"],
                          timeout=30)
    text = "\n".join(line for line in out.strip().splitlines() if line.strip() != "-- No entries --")
    return text.strip() if code == 0 else ""


def journal_tail(scope):
    """The unit's last journal lines. A user unit's are in the user's own journal file only where the
    journal is persistent: journald splits it per user (SplitMode=uid) on persistent storage alone, so on a
    volatile journal (Storage=volatile, or auto with no /var/log/journal: many boards) ``journalctl --user``
    finds nothing and the lines are in the system journal, matched by ``--user-unit`` (_SYSTEMD_USER_UNIT=
    and _UID=; journald.conf(5) "SplitMode=", journalctl(1) "--user-unit"). Where neither shows any (the
    system journal is readable by root and the groups systemd-journal and adm only), say where they are."""
    if scope == "system":
        return journal_lines("-u", SERVICE_NAME) or "(no journal lines)"
    text = journal_lines("--user", "-u", SERVICE_NAME) or journal_lines("--user-unit", SERVICE_NAME)
    return text or (f"(no journal lines readable as {getpass.getuser()}: on a board whose journal is volatile "
                    "a user unit's lines are in the system journal; read them with 'sudo journalctl "
                    f"--user-unit {SERVICE_NAME} _UID={os.geteuid()}', or add {getpass.getuser()} to the group "
                    "systemd-journal)")


# The board asks its own address: never through the http_proxy that /etc/environment may set for apt and
# pip (urllib honours it, and bypasses only what no_proxy lists, which rarely names 127.0.0.1).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def healthy(url):
    """Whether ``url`` answers 200. A program on the port that is no HTTP server (an ssh daemon, a raw TCP
    service) is no answer either: its reply is no status line, which http.client raises as an HTTPException
    (BadStatusLine, LineTooLong), neither an OSError nor a URLError, through urllib."""
    return health_body(url) is not None


HEALTH_BODY_MAX = 65536


def health_body(url):
    """What ``url`` answers with 200: its JSON object (``edgesdk serve``'s /health names the model and the backend
    it runs on), ``{}`` where the body is no JSON object; None where it does not answer 200 (see :func:`healthy`)."""
    try:
        with DIRECT.open(url, timeout=5) as reply:
            if reply.status != 200:
                return None
            data = reply.read(HEALTH_BODY_MAX)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return None
    try:
        body = json.loads(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is one
        return {}
    return body if isinstance(body, dict) else {}


# A route of serve's that answers only with the API key where one is set (not /health, nor the model lists: public
# as llama-server's), asked without one: 401 says a key guards the server.
KEYED_ROUTE = "/props"


def api_key_required(health_url):
    """Whether the server behind ``health_url`` asks for an API key: True (401 without one), False (it answered
    without one), None (no answer that says: another server, or none)."""
    parts = urllib.parse.urlsplit(health_url)
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, KEYED_ROUTE, "", ""))
    try:
        with DIRECT.open(url, timeout=5) as reply:
            return False if reply.status == 200 else None
    except urllib.error.HTTPError as exc:
        return True if exc.code == 401 else None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return None


# The SubStates of a service whose server exited and that systemd starts again (ActiveState "activating"): it waits
# out RestartSec in "auto-restart", then, from systemd 254 on, in "auto-restart-queued" until its start job runs
# (src/basic/unit-def.c service_state_table; systemctl's own wait for units treats both as a restart).
RESTARTING = ("auto-restart", "auto-restart-queued")
# The ActiveStates in which the unit's own server runs: while it reloads, and while it stops (ExecStop, SIGTERM not yet
# obeyed) it still holds its port.
SERVING = ("active", "reloading", "deactivating")


def unit_state(scope):
    """(ActiveState, SubState) of the unit. A server that exited waits out RestartSec in "activating" /
    "auto-restart" (RESTARTING), which ``systemctl is-active`` prints as "activating", like one still starting."""
    _, out = systemctl(scope, "is-active", SERVICE_NAME, timeout=30)
    if out.strip() != "activating":
        return out.strip(), ""
    code, out = systemctl(scope, "show", SERVICE_NAME, "-p", "SubState", timeout=30)
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return "activating", props.get("SubState", "").strip() if code == 0 else ""


def wait_until_healthy(scope, url, timeout_s):
    """The /health body once ``url`` answers 200 (:func:`health_body`: a dict, ``{}`` where it is no JSON object),
    so the deploy says the backend the server runs on; False when the unit failed, exited (systemd restarting it),
    or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = health_body(url)
        if body is not None:
            return body
        active, sub = unit_state(scope)
        if active in ("failed", "inactive") or sub in RESTARTING:
            body = health_body(url)
            return False if body is None else body
        time.sleep(HEALTH_POLL_S)
    body = health_body(url)
    return False if body is None else body


def enable_linger():
    """Lingering for this user (a user unit then starts at boot and outlives logouts); a note, never a
    refusal. Without it logind stops the user's manager, and the unit with it, once the user's last
    session ends - the deploy's own ssh session is one (loginctl(1) "enable-linger")."""
    user = getpass.getuser()
    code, out = run_quiet(["loginctl", "show-user", user, "--property=Linger", "--value"], timeout=30)
    if code == 0 and out.strip() == "yes":
        return "lingering is on: the user service starts at boot"
    code, out = run_quiet(["loginctl", "enable-linger", user], timeout=30)
    if code == 0:
        return "lingering turned on: the user service starts at boot"
    why = (out.strip().splitlines() or ["loginctl failed"])[-1]
    return (f"warning: lingering could not be turned on ({why}), so the user service stops when {user}'s last "
            "session on the board ends (this deploy's ssh session is one) and does not start at boot; run "
            f"'sudo loginctl enable-linger {user}' on the board once, or deploy as root for a system unit")


def read_record(record_path):
    """The deploy root's ``service.json``, or None where there is none (or it does not parse)."""
    try:
        with open(record_path, encoding="utf-8") as handle:
            record = json.load(handle)
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None


def listening(url):
    """Whether anything accepts a TCP connection on the host and port of ``url``. Not only a server whose
    /health says 200 holds the port: Ollama answers 404 there, llama-server 503 while it loads its model,
    and any other program (a web UI, a proxy) holds the port without answering HTTP at all; the unit's
    server could listen there no more than beside one that says 200 (bind(2) EADDRINUSE)."""
    try:
        parts = urllib.parse.urlsplit(url)
        with socket.create_connection((parts.hostname, parts.port), timeout=5):
            return True
    except (OSError, ValueError, TypeError):
        return False


def unit_bind(path):
    """(host, port) that the unit file at ``path`` gives ``edgesdk serve`` (its ExecStart's ``--host`` and
    ``--port``, as render_unit writes them), or None where there is no such file or line."""
    try:
        with open(path, encoding="utf-8") as handle:
            line = next(x for x in handle.read().splitlines() if x.startswith("ExecStart="))
        words = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line[len("ExecStart="):])]
        return words[words.index("--host") + 1], int(words[words.index("--port") + 1])
    except (OSError, TypeError, StopIteration, ValueError, IndexError):
        return None


def unit_host_argv(path):
    """``["--host", HOST]`` of the unit file at ``path`` (where bind_conflict_urls looks for a ``::`` bind), or []
    where it names none."""
    bind = unit_bind(path)
    return ["--host", bind[0]] if bind else []


def unit_answers_on(unit, url):
    """Whether the server of the unit file ``unit`` is what accepts connections on the host and port of ``url``:
    the same port, and a bind on that very address or on a wildcard. A server bound to 0.0.0.0 (or to ::, which
    on Linux takes IPv4 too unless bindv6only is set) accepts on every address of the board, and while it holds
    the port no other program can bind any address of the board to it (bind(2) EADDRINUSE; ip(7)
    SO_REUSEADDR: not while a socket listens there). Its health URL is 127.0.0.1, so a unit moved from 0.0.0.0
    to a LAN address on the same port was taken for a foreign server by its URL alone. Addresses are compared,
    not their spelling: a unit on ``--host localhost`` listens on 127.0.0.1 (serve binds a name's first IPv4
    address, as socket.bind resolves it), ``0::0`` is ``::``, and host names match in any case (RFC 4343)."""
    bind = unit_bind(unit)
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if bind is None or host is None or bind[1] != port:
        return False
    bound = bind[0].strip("[]")
    # serve binds an address with ':' as IPv6, anything else as IPv4: a name is resolved (getaddrinfo, AF_INET)
    # and its first address taken, as Python's socket.bind does; "localhost" is 127.0.0.1 there, and "0::0" is "::"
    addresses = _addresses(bound, socket.AF_INET6 if ":" in bound else socket.AF_INET)
    if not addresses:  # a name that does not resolve now: the names alone, as DNS compares them (any case)
        return bound.lower() == host.lower()
    address, asked = addresses[0], _addresses(host)
    if address.is_unspecified:  # 0.0.0.0 takes every IPv4 address of the board; :: every address
        return address.version == 6 or not asked or any(a.version == 4 for a in asked)
    return address in asked or bound.lower() == host.lower()


def _addresses(host, family=0):
    """The addresses getaddrinfo(3) gives ``host`` (an address as itself), in its order; [] where it gives none."""
    try:
        found = socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        return []
    addresses = []
    for *_, sockaddr in found:
        try:
            address = ipaddress.ip_address(sockaddr[0])
        except ValueError:
            continue
        if address not in addresses:
            addresses.append(address)
    return addresses


def refuse_a_foreign_server(scope, url, record, fix, argv=()):
    """Refuse where something other than this unit already listens on the port of ``url``: the unit's server
    could not listen there (llama-server's default port is 8080 too, Ollama's 11434), and a server that says
    200 on /health would be taken for the unit's own. An active unit (or one reloading or stopping: its server runs
    still, :data:`SERVING`) that this root installed for the same URL, or whose unit file has its server listen there,
    is the one answering; one installed for another port (by another deploy root: this one has no record) is not.
    Where this root has no record and the unit file does not say where its server listens (unreadable, or an
    ExecStart without ``--host`` and ``--port``), the active unit is taken for the one answering, as it was before
    unit files were read: nothing says otherwise.
    ``argv`` (the unit's serve command line) says where else its bind needs the port (:func:`bind_conflict_urls`)."""
    code, state = systemctl(scope, "is-active", SERVICE_NAME, timeout=30)
    unit = (record or {}).get("unit") or unit_path(scope)
    active = state.strip() in SERVING
    answers = active and ((record or {}).get("health_url") == url or unit_answers_on(unit, url)
                          or (not record and unit_bind(unit) is None))
    for at in bind_conflict_urls(url, argv):
        # the IPv4 port of a :: bind is the running unit's where its unit file binds it (--host :: and --host ::1
        # have one health URL, ::1, and a unit on ::1 holds no IPv4 port); a unit file that does not say where its
        # server listens: the health URL's answer
        ours = answers if at == url or unit_bind(unit) is None else active and unit_answers_on(unit, at)
        if not ours and listening(at):
            port = urllib.parse.urlsplit(at).port
            also = "" if at == url else f", as its bind on :: takes the IPv4 port {port} too"
            raise Refused(f"something other than the {scope} unit {SERVICE_NAME} already answers on {at} (a program "
                          f"accepts connections on port {port}), so the unit's server could not listen there{also} "
                          "(llama-server also defaults to port 8080, Ollama to 11434)", fix)


def bind_conflict_urls(url, argv):
    """Where a server that holds the port keeps the unit's server from binding: the health URL, and for an IPv6
    wildcard bind (``--host ::`` in ``argv``, the serve command line; its health URL is ``::1``) the IPv4 loopback
    too where a ``::`` bind takes IPv4 (:func:`ipv6_binds_ipv4`): a server on 127.0.0.1 (where llama-server
    listens by default) then makes that bind fail with EADDRINUSE, while nothing answers on ``::1``."""
    argv = list(argv or [])
    try:
        bound = ipaddress.ip_address(argv[argv.index("--host") + 1].strip("[]"))
    except (ValueError, IndexError):
        return [url]
    if bound.version != 6 or not bound.is_unspecified or not ipv6_binds_ipv4():
        return [url]
    parts = urllib.parse.urlsplit(url)
    return [url, parts._replace(netloc=f"127.0.0.1:{parts.port}").geturl()]


def ipv6_binds_ipv4():
    """Whether a bind on ``::`` takes the IPv4 port too: serve sets no IPV6_V6ONLY, so net.ipv6.bindv6only decides
    (0, the default: it does; ipv6(7) "IPV6_V6ONLY"). A kernel without IPv6 has no such file: taken as 0."""
    try:
        with open(BINDV6ONLY, encoding="ascii") as handle:
            return handle.read().strip() == "0"
    except (OSError, ValueError):
        return True


def owner_and_restart(scope, uid):
    """The name of the user ``uid`` who installed the unit, and the command that restarts it on the board: a unit
    another user installed is not this user's to restart, as systemctl --user reaches only this user's manager,
    and a system unit needs root."""
    try:
        import pwd

        name = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError, OverflowError, TypeError):
        name = f"uid {uid}"
    return name, ("sudo systemctl restart " + SERVICE_NAME if scope == "system" else
                  f"as {name}: systemctl --user restart {SERVICE_NAME}")


def port_taken_fix(scope):
    """The fix where another program took the port of the unit this user installed, before its restart."""
    return ("stop that program, or deploy with --service --service-port PORT (a port nothing listens on), which "
            f"rewrites the unit; then restart the unit ({owner_and_restart(scope, os.geteuid())[1]})")


def refuse_another_owner(scope, path, uid, during="rollback"):
    """Refuse the restart of a unit another user installed. ``during`` names what asked for the restart (a
    "rollback"; a deploy is told why the unit was not restarted instead, see op_service)."""
    name, command = owner_and_restart(scope, uid)
    raise Refused(f"the {scope} unit {path} that serves current was installed by {name}, and this {during} runs "
                  f"as {getpass.getuser()}, so it cannot restart it; the unit still serves the release it started with",
                  f"restart it on the board ({command})" + ("; running the rollback again would switch current once "
                                                            "more" if during == "rollback" else ""))


def write_atomically(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial-{os.getpid()}"  # the unit file is one per board, shared by every deploy root
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    fsync_dir(os.path.dirname(path))


def save_before(root, scope, path, record_path, token):
    """Write ``service.before.json``: the install's ``token``, the unit file's text (None where there was
    none), the deploy root's record and whether the unit was active and enabled, before an install changes any
    of them."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        text = None
    code, state = systemctl(scope, "is-active", SERVICE_NAME, timeout=30)
    enabled = ""  # the install enables the unit: "disabled" is disabled again by a revert
    if text is not None:
        enabled = systemctl(scope, "is-enabled", SERVICE_NAME, timeout=30)[1]
    write_atomically(os.path.join(root, SERVICE_BEFORE), json.dumps(
        {"token": token, "scope": scope, "unit": path, "text": text, "record": read_record(record_path),
         "active": text is not None and state.strip() == "active", "enabled": enabled.strip()}) + "\n")


def revert_unit(root, record_path, timeout_s, fix, token):
    """Put back what the last install changed (``action`` "revert", after its service did not come up):
    the unit file as it was and the server that ran before, restarted on ``current`` and waited for; a
    unit that was stopped stays stopped, one that was disabled is disabled again, and one this deploy wrote where there was none is stopped,
    disabled and removed. Nothing to put back (the install with ``token`` refused before changing anything,
    whatever a killed or concurrent deploy left) is ``{"reverted": False}``."""
    before_path = os.path.join(root, SERVICE_BEFORE)
    with Lock(root):
        before = read_record(before_path)
        if before is None or before.get("token") != token:
            return {"reverted": False}
        scope, path = before["scope"], before["unit"]
        if before["text"] is None:
            systemctl(scope, "stop", SERVICE_NAME)
            systemctl(scope, "disable", SERVICE_NAME)
            if os.path.exists(path):
                os.remove(path)
                fsync_dir(os.path.dirname(path))
            outcome = "removed"
        else:
            write_atomically(path, before["text"])
            outcome = "restarted" if before["active"] else "stopped"
            if before.get("enabled") == "disabled":  # the install enabled it: it would start at boot
                systemctl(scope, "disable", SERVICE_NAME)
        if before["record"] is None:
            if os.path.exists(record_path):
                os.remove(record_path)
        else:
            write_atomically(record_path, json.dumps(before["record"]) + "\n")
        systemctl(scope, "daemon-reload")
        code, out = restart_unit(scope) if outcome == "restarted" else systemctl(scope, "stop", SERVICE_NAME)
        os.remove(before_path)
    url = (before["record"] or {}).get("health_url")
    if outcome == "restarted" and (code != 0 or (url and wait_until_healthy(scope, url, timeout_s) is False)):
        reason = out.strip()[-500:] if code != 0 else f"no answer from {url} within {timeout_s:.0f} s"
        journal = journal_tail(scope).replace("\n", "\n      ")
        raise Refused(f"the {scope} service {SERVICE_NAME}, put back as it was, did not come up again: "
                      f"{reason}\n    its journal:\n      {journal}", fix)
    return {"reverted": True, "scope": scope, "unit": path, "outcome": outcome}


def why_not_restarted(scope):
    """Why the installed unit is not to be restarted after a switch (None where it is): a board whose systemd
    is gone since the install runs no unit to restart, and that is no fault of the release switched to; a
    unit stopped on purpose stays stopped. ``systemctl stop`` leaves it "inactive" and ``systemctl disable
    --now`` (what the install says to run to keep it stopped) "inactive" and "disabled", while a server that
    crashed is "failed" and still enabled: that one is started, as ``restart`` starts any unit
    (systemctl(1) "is-active", "is-enabled", "restart")."""
    start = f"systemctl{' --user' if scope == 'user' else ''} start {SERVICE_NAME}"
    if shutil.which("systemctl") is None:
        return ("the board has no systemctl any more, so no unit runs there; start the server yourself "
                "(edgesdk serve on current) or install systemd and deploy with --service again")
    code, out = systemctl(scope, "show-environment", timeout=30)
    if code != 0:
        manager = "system manager" if scope == "system" else "manager of this user (systemctl --user)"
        return (f"the systemd {manager} does not answer ({(out.strip() or f'exit {code}').splitlines()[-1]}), so the "
                f"unit is not running under it; once systemd runs it serves current ({start})")
    active = unit_state(scope)[0]
    if active in ("active", "activating", "reloading"):
        return None
    enabled = systemctl(scope, "is-enabled", SERVICE_NAME, timeout=30)[1].strip()
    if active == "inactive" or enabled == "disabled":
        kept = f"{active or 'not running'}{', disabled' if enabled == 'disabled' else ''}"
        return (f"it is stopped ({kept}), as it was left on the board, so it stays stopped; it serves current "
                f"once started ({start})")
    return None


# systemd's own test of whether it is the init (sd_booted(3)): the directory exists only while systemd runs as PID 1.
SYSTEMD_BOOTED = "/run/systemd/system"


def manager_silent(scope, code, out, command):
    """The refusal where ``systemctl show-environment`` fails: systemd's manager of ``scope`` does not answer. On a
    machine not booted with systemd (a container such as jetson-containers', where deploy runs as root, or another
    init system) no manager runs for any user, so neither root nor a lingering user helps: the server is to be started
    by hand (``command``). Where systemd is the init, root's system manager not answering is systemd's own fault, and
    a user's manager runs once the user logs in or lingers (sd_booted(3), loginctl(1) "enable-linger")."""
    where = "system manager" if scope == "system" else "manager of this user (systemctl --user)"
    said = (out.strip() or f"exit {code}").splitlines()[-1]
    if not os.path.isdir(SYSTEMD_BOOTED):
        return Refused(f"systemd's {where} does not answer ({said}): this machine was not booted with systemd as its "
                       f"init (there is no {SYSTEMD_BOOTED}: a container, or another init system), so no unit runs "
                       "here", f"deploy without --service and start the server yourself: {command}")
    if scope == "system":
        return Refused(f"systemd's {where} does not answer ({said})",
                       "check systemd on the board (systemctl status; journalctl -b), or deploy without --service and "
                       f"start the server yourself: {command}")
    runtime = os.path.join(USER_RUNTIME_ROOT, str(os.geteuid()))
    if not owned_directory(runtime):  # no manager runs for this user: a login without pam_systemd starts none
        return Refused(f"systemd's {where} does not answer ({said}): it is not running (there is no {runtime}, "
                       "which it would listen in)",
                       f"run 'sudo loginctl enable-linger {getpass.getuser()}' on the board once, which starts it and "
                       "keeps it running, then deploy again; or deploy as root for a system unit")
    return Refused(f"systemd's {where} does not answer ({said})",
                   "deploy as root for a system unit, or log in once on the board so the user manager runs "
                   f"(sudo loginctl enable-linger {getpass.getuser()} keeps it running)")


def op_service(params):
    """Check that systemd answers (``action`` "check"), install (``action`` "install"), restart where
    installed (``action`` "restart", after a rollback; with ``unless_up``, after a deploy that switched nothing,
    only where the unit is not active and answering on its /health) or put back as before the last install
    (``action`` "revert", after a deploy whose service did not come up) the serving unit, then wait for its /health.
    The deploy root's ``service.json`` remembers the unit, so a restart asks the address the unit was
    installed with, and is refused, as an install is, where another program took that port since."""
    p, root = paths(params["root"])
    record_path = os.path.join(root, SERVICE_RECORD)
    if params["action"] == "revert":
        return revert_unit(root, record_path, float(params["timeout_s"]), params["fix"], params["token"])
    if params["action"] == "restart":
        record = read_record(record_path) or {}
        try:
            scope, path, url = record["scope"], record["unit"], record["health_url"]
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, KeyError, TypeError):
            return {"installed": False}  # none installed, or removed since
        if systemd_quote(p["current"]) + " " not in text:  # another deploy root's --service took the unit over
            return {"installed": True, "restarted": False, "scope": scope, "unit": path,
                    "why": f"it no longer serves {p['current']} (a deploy with --service into another root "
                           "rewrote it)"}
        owner = record.get("uid", os.geteuid())
        if owner != os.geteuid() and params.get("during") == "deploy":
            # No fault of the release switched to, smoke-tested: current stays on it, and the unit serves it once
            # its owner restarts it. Switching back would undo every deploy of this user while the unit is there.
            name, command = owner_and_restart(scope, owner)
            return {"installed": True, "restarted": False, "scope": scope, "unit": path,
                    "why": f"it was installed by {name}, and this deploy runs as {getpass.getuser()}, so it cannot "
                           "restart it; it still serves the release it started with, not current, until it is restarted on "
                           f"the board ({command})"}
        if owner != os.geteuid():
            refuse_another_owner(scope, path, owner, params.get("during", "rollback"))
        why = why_not_restarted(scope)
        if why:
            return {"installed": True, "restarted": False, "scope": scope, "unit": path, "why": why}
        if params.get("unless_up") and unit_state(scope)[0] == "active":
            # a deploy that switched nothing: a unit that runs and answers serves current already. Not one that is
            # stopping (its server answers until it exits), nor where the answer is another program's on the port
            # (as before a restart, below)
            refuse_a_foreign_server(scope, url, record, port_taken_fix(scope), unit_host_argv(path))
            if healthy(url):
                return {"installed": True, "restarted": False, "up": True, "scope": scope, "unit": path}
    else:
        scope = unit_scope()
        path, url = unit_path(scope), params["health_url"]
    timeout_s = float(params["timeout_s"])
    command = shlex.join(params["argv"]) if params["argv"] else "edgesdk serve"
    if shutil.which("systemctl") is None:
        raise Refused("the board has no systemctl, so --service cannot install a systemd unit",
                      f"deploy without --service and start the server yourself: {command}")
    code, out = systemctl(scope, "show-environment", timeout=30)
    if code != 0:
        raise manager_silent(scope, code, out, command)
    if params["action"] == "check":  # before the deploy changes anything
        refuse_a_foreign_server(scope, url, read_record(record_path),
                                "pass --service-port with a port nothing listens on, or stop that server", params["argv"])
        refusal = unit_dir_refusal(scope, path, command)
        if refusal:
            raise refusal
        return {"installed": os.path.exists(path), "scope": scope, "unit": path}
    notes, changed = [], False
    with Lock(root):  # a concurrent deploy's unit, record and restart wait for this one's
        if params["action"] == "restart":
            # a program that took the port since the install (llama-server, which says 200 on /health too) would
            # answer for the unit's server, which cannot listen there: reported restarted while it served nothing
            refuse_a_foreign_server(scope, url, record, port_taken_fix(scope), unit_host_argv(path))
        if params["action"] == "install":
            text = render_unit(params["argv"], scope)  # refuses a program systemd would not start: nothing changed
            refuse_a_foreign_server(scope, url, read_record(record_path), params["fix"], params["argv"])
            refusal = unit_dir_refusal(scope, path, command)
            if refusal:
                raise refusal
            save_before(root, scope, path, record_path, params["token"])
            try:
                with open(path, encoding="utf-8") as handle:
                    changed = handle.read() != text
            except OSError:
                changed = True
            if changed:
                write_atomically(path, text)
            write_atomically(record_path, json.dumps({"scope": scope, "unit": path, "health_url": url,
                                                      "uid": os.geteuid()}) + "\n")
            for args in (["daemon-reload"], ["enable", SERVICE_NAME]):
                code, out = systemctl(scope, *args)
                if code != 0:
                    raise Refused(f"systemctl {' '.join(args)} failed: {out.strip()[-500:]}",
                                  f"check the unit {path} and the board's systemd, then deploy again")
            if scope == "user":
                notes.append(enable_linger())
        elif scope == "user":  # a restart: lingering may be off still (or again), and the unit stops with the session
            note = enable_linger()
            if not note.startswith("lingering is on"):
                notes.append(note)
        code, out = restart_unit(scope)
    health = wait_until_healthy(scope, url, timeout_s) if code == 0 else False
    if health is False:
        active, sub = unit_state(scope) if code == 0 else ("", "")
        if code != 0:
            reason = out.strip()[-500:]
        elif sub in RESTARTING:
            reason = "its server exited, and systemd starts it again after RestartSec (the journal says why)"
        elif active in ("failed", "inactive"):
            reason = f"its server exited (the unit is {active})"
        else:
            reason = f"no answer from {url} within {timeout_s:.0f} s"
        journal = journal_tail(scope).replace("\n", "\n      ")
        raise Refused(f"the {scope} service {SERVICE_NAME} did not come up: {reason}\n    its journal:\n      {journal}",
                      params["fix"])
    if params["action"] == "install":
        with Lock(root):  # up: nothing to put back (a concurrent deploy's own file stays)
            before_path = os.path.join(root, SERVICE_BEFORE)
            if (read_record(before_path) or {}).get("token") == params["token"]:
                with contextlib.suppress(OSError):
                    os.remove(before_path)
    return {"installed": True, "restarted": True, "scope": scope, "unit": path, "changed": changed, "notes": notes,
            "backend": health.get("backend"), "api_key": api_key_required(url)}
