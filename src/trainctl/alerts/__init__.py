"""Alerts: a person hears about what trainctl saw and did (issue 17).

* ``settings``: where alert URLs come from (``alerts.toml`` in the config dir, the job's
  ``[alerts]``, ``--alert``), the run's private ``alerts.json``, and :func:`redact`.
* ``policy``: the pure :class:`AlertPolicy` (time is an argument): one message per incident,
  at most one a minute, the rest in a digest.
* ``sink``: :class:`AlertSink`, the agent's EventBus sink; it returns at once and sends from
  a thread through a short-lived helper process (``send``), so apprise (~26 MB) is never
  imported into the agent and a receiver that hangs costs nothing but that helper.
* ``send``: ``python -m trainctl.alerts.send``: the only module that imports apprise.
"""
