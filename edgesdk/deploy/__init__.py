"""``edgesdk deploy``: ship a built bundle to a board over SSH (or into a local directory), install
the matching edgesdk runtime, verify every file on the board, switch ``current`` atomically, build
the TensorRT engine on a Jetson, smoke-test, and roll back on failure.

Modules: ``transport`` (OpenSSH client, local), ``board_*`` (the board side, stdlib only, sent as
one script), ``remote`` (calling it), ``probe`` (board facts and the target/memory/disk checks), ``install``
(runtime wheel and venv), ``transfer`` (resumable upload), ``engine`` (TensorRT step), ``service``
(systemd unit), ``session`` (options and shared steps), ``orchestrate`` (deploy), ``releases``
(status and rollback). Importing this package imports none of them.
"""
