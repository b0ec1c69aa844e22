"""Thermal guard for Jetson and Raspberry Pi boards (DESIGN.md, "Thermal guard").

* :mod:`~edgesdk.thermal.sensors`: sysfs thermal zones, ``vcgencmd``, jetson-stats (optional).
* :mod:`~edgesdk.thermal.simulator`: first-order thermal model with the firmware throttle emulated.
* :mod:`~edgesdk.thermal.guard`: levels normal / warm / hot / critical, compute budget, pacing, pauses.
* :mod:`~edgesdk.thermal.watch`: the generation-loop hook and the ``edgesdk run`` wiring.
* :mod:`~edgesdk.thermal.telemetry`: JSONL records, live status line, run summaries.
* :mod:`~edgesdk.thermal.plan`: simulated request streams, guarded vs unguarded.
* :mod:`~edgesdk.thermal.report`: PNG plots (matplotlib, extra ``[report]``; never imported by the runtime).

Nothing here imports torch, transformers or onnxruntime.
"""

# The ambients a board is simulated in (``--ambient``) and a profile's thermal_model.ambient_c may give: the industrial
# temperature range (-40 to 85 °C) its parts are rated for. Here, in a package that imports nothing, so that neither
# the CLI (edgesdk/cli_thermal.py, imported for every command) nor the library (edgesdk/profile.py) imports the other.
AMBIENT_RANGE_C = (-40, 85)
