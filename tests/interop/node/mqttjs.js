// MQTT.js driver for the interop tests. One JSON argument:
//   {"url": "ws://127.0.0.1:8083/mqtt", "protocolVersion": 4|5, "clientId": "...",
//    "ca": "/path/ca.crt" (wss), "action": "sub"|"pub", "topic": "...", "qos": 0|1|2,
//    "message": "..." (pub), "count": N (sub)}
// sub prints "READY" once subscribed, then one JSON line per message, and exits after
// `count` messages; pub publishes (waiting for the QoS flow) and exits once its writes
// are flushed. Exit 2 on error.
const mqtt = require("mqtt");
const fs = require("fs");

const opts = JSON.parse(process.argv[2]);
const connectOpts = {
  protocolVersion: opts.protocolVersion || 4,
  clientId: opts.clientId,
  reconnectPeriod: 0,
  connectTimeout: 10000,
};
if (opts.ca) {
  connectOpts.ca = fs.readFileSync(opts.ca);
  connectOpts.rejectUnauthorized = true;
}
const client = mqtt.connect(opts.url, connectOpts);
const fail = (err) => {
  console.error(String(err));
  process.exit(2);
};
client.on("error", fail);
setTimeout(() => fail("timeout"), 30000).unref();

client.on("connect", () => {
  if (opts.action === "sub") {
    let seen = 0;
    client.on("message", (topic, payload, packet) => {
      console.log(JSON.stringify({ topic, payload: payload.toString(), qos: packet.qos }));
      seen += 1;
      if (seen >= (opts.count || 1)) client.end(false);  // node exits once flushed
    });
    client.subscribe(opts.topic, { qos: opts.qos }, (err, granted) => {
      if (err) fail(err);
      console.log("READY " + JSON.stringify(granted));
    });
  } else {
    client.publish(opts.topic, opts.message, { qos: opts.qos }, (err) => {
      if (err) fail(err);
      // no process.exit(): it would drop writes still queued (a QoS 0 PUBLISH)
      client.end(false);
    });
  }
});
