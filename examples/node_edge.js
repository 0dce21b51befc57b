// A minimal simbridge edge in Node.js: WebSocket + protobufjs, nothing else (docs/protocol.md).
//
//   npm install ws protobufjs
//   node examples/node_edge.js ws://127.0.0.1:8080/v1/ingest 10
//
// It says Hello, publishes COUNT small point clouds (x, y, z float32, stride 12) on stream
// "lidar", keeps each one until the bridge reports it *delivered* (StreamAck.delivered_seq,
// cumulative), then prints a JSON summary and exits 0. Points worth knowing:
// - load the .proto with keepCase: true, so fields are named as on the wire (delivered_seq);
// - uint64 fields (seq, *_seq) decode as Long objects: compare them with Number(...);
// - one binary WebSocket message = one EdgeMessage / BridgeMessage; no compression;
// - the device id goes in the URL (?device=) and the x-simbridge-device header, where a load
//   balancer in front of several bridges can hash it (docs/protocol.md §1, routing key).
"use strict";
const path = require("path");
const WebSocket = require("ws");
const protobuf = require("protobufjs");

const [url = "ws://127.0.0.1:8080/v1/ingest", countArg = "10", device = "node-edge"] =
  process.argv.slice(2);
const COUNT = Number(countArg);

function cloud(i) {
  const n = 100;
  const xyz = new Float32Array(n * 3);
  for (let k = 0; k < n; k++) {
    const a = (2 * Math.PI * k) / n;
    xyz.set([Math.cos(a) * (1 + i), Math.sin(a) * (1 + i), 0.1 * i], k * 3);
  }
  return {
    point_stride: 12,
    fields: ["x", "y", "z"].map((name, j) => ({ name, offset: 4 * j, type: 7 /* FLOAT32 */ })),
    data: Buffer.from(xyz.buffer),
  };
}

async function main() {
  const proto = path.join(__dirname, "..", "proto", "bridge", "v1", "bridge.proto");
  const root = await new protobuf.Root().load(proto, { keepCase: true });
  const EdgeMessage = root.lookupType("bridge.v1.EdgeMessage");
  const BridgeMessage = root.lookupType("bridge.v1.BridgeMessage");
  const send = (ws, msg) => ws.send(EdgeMessage.encode(EdgeMessage.create(msg)).finish());

  const routed = new URL(url);
  routed.searchParams.set("device", device);
  const ws = new WebSocket(routed.toString(), {
    perMessageDeflate: false,
    headers: { "x-simbridge-device": device },
  });
  const buffer = new Map(); // seq -> frame, kept until delivered
  let delivered = 0;
  const timer = setTimeout(() => { console.error("timed out"); process.exit(1); }, 30000);

  ws.on("open", () => {
    send(ws, { hello: { device_id: device, streams: [{ stream_id: "lidar", kind: 1 /* POINT_CLOUD */ }] } });
  });
  ws.on("message", (data) => {
    const msg = BridgeMessage.decode(data);
    if (msg.welcome) {
      for (let seq = 1; seq <= COUNT; seq++) {
        const frame = { stream_id: "lidar", seq, capture_time_ns: Date.now() * 1e6, point_cloud: cloud(seq) };
        buffer.set(seq, frame);
        send(ws, { frame });
      }
    } else if (msg.ack) {
      for (const s of msg.ack.streams) {
        if (s.stream_id !== "lidar") continue;
        delivered = Math.max(delivered, Number(s.delivered_seq));
        for (const seq of [...buffer.keys()]) if (seq <= delivered) buffer.delete(seq);
      }
      if (delivered >= COUNT) {
        clearTimeout(timer);
        console.log(JSON.stringify({ device, published: COUNT, delivered, buffered: buffer.size }));
        ws.close(1000);
      }
    } else if (msg.error) {
      console.error("bridge error:", msg.error.code, msg.error.message);
      if (msg.error.fatal) process.exit(1);
    } else if (msg.flow_control) {
      // PAUSE/RESUME: a real edge would stop/restart sending this stream; 10 frames never fill a ring.
    }
  });
  ws.on("close", () => process.exit(delivered >= COUNT ? 0 : 1));
  ws.on("error", (err) => { console.error(err.message); process.exit(1); });
}

main();
