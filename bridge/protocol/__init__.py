"""What every side of the bridge shares: the wire format, point-cloud layouts and codecs, frame
batches, the sink's Push stream and the protocol's errors. Imports nothing else of ``bridge``
but the generated ``bridge.v1`` messages: the edge SDK, the viewer and the decimator build on
it without the server."""
