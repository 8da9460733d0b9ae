"""What each candidate costs on this machine (or on a fleet of others), measured once and logged.

``measure.Measurer`` is the cost source: the log first (``cost_log``, SQLite), then
measurements, skipping candidates no winning placement would use (``SearchBound``).
``isolation`` is where a candidate is compiled, checked and timed (a worker process by
default: a crash or a hang costs one candidate), on the helpers of ``runner``; ``timing``
holds the one timing protocol; ``transition`` measures what entering a backend costs;
``cost.Cost`` is a value, or invalid with its reason, or unknown; ``meters`` read energy where
the machine has a counter; ``threads`` sets the process-wide thread counts. On a fleet,
``rpc_runner.RPCRunner`` sends the work to measuring servers (``collage.server``, ``collage serve``)
through TVM's RPC tracker, as plain data (``wire``).
"""
