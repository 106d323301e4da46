#!/usr/bin/env node
// A proxyless gRPC client in Node.js (@grpc/grpc-js with @grpc/grpc-js-xds, xDS from
// GRPC_XDS_BOOTSTRAP) for crates/lbkit/tests/xds.rs: the same calls as
// scripts/xds_grpc_client.py makes with grpcio.
//
//     NODE_PATH=$LBKIT_NODE/node_modules node xds_grpc_js_client.js TARGET INTERVAL_MS [KEY=VALUE]
//
// Calls /lbkit.Deadline/Call (scripts/grpc_deadline.py's servers) on TARGET, `xds:///NAME`,
// every INTERVAL_MS on one channel until killed, printing one line per call on stdout:
// "answer NAME" (the server that answered) or "failed CODE DETAILS". KEY=VALUE: metadata every
// call carries (what a route's header hash policy hashes).
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

const [target, intervalMs] = [process.argv[2], Number(process.argv[3])];
const client = new grpc.Client(target, grpc.credentials.createInsecure());
const same = (b) => b;
const metadata = new grpc.Metadata();
if (process.argv[4]) {
  const at = process.argv[4].indexOf('=');
  metadata.set(process.argv[4].slice(0, at), process.argv[4].slice(at + 1));
}

function call() {
  const deadline = new Date(Date.now() + 5000);
  client.makeUnaryRequest('/lbkit.Deadline/Call', same, same, Buffer.from('ping'), metadata, { deadline }, (err, reply) => {
    if (err) {
      console.log(`failed ${grpc.status[err.code]} ${err.details}`);
    } else {
      console.log(`answer ${reply.toString().split(' ')[0]}`);
    }
    setTimeout(call, intervalMs);
  });
}
call();
