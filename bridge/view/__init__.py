"""``simbridge view``: a visualization sink that shows and records what the bridge delivers.

It serves ``VisualizationSink.Push`` and fans every processed frame out to a Foxglove WebSocket
server, an MCAP recording and a browser page. Layout, one concern per module:

- ``ledger``    per-stream watermarks and duplicate detection (sans-I/O)
- ``convert``   ProcessedFrame -> Foxglove/MCAP messages on ``/<device>/<stream>`` topics (sans-I/O)
- ``stats``     per-stream rates, gaps and lag for the status panel (sans-I/O)
- ``webframe``  the compact binary cloud the browser page draws (sans-I/O)
- ``fanout``    bounded, dropping queues towards viewers (a slow viewer never slows acks)
- ``servicer``  the Push handler: watermarks first, write, then cumulative ``bridge_seq`` acks
- ``mcap_out``  rotating MCAP files, flushed before an ack; resume from their watermarks
- ``foxglove_out``  the Foxglove WebSocket server (foxglove-sdk)
- ``web``       the page, its static files and ``/api/status``
- ``service``, ``cli``  lifecycle and the command line
- ``feed``, ``sidecar``  tee frames from another program (the load generator's demo) into a view

foxglove-sdk and mcap come with the ``view`` extra (``pip install simbridge[view]``); the bridge
itself never imports this package.
"""
