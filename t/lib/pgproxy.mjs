// A TCP relay on 127.0.0.1 to the test PostgreSQL's Unix socket that a
// test can cut and restore, to take the database away from a gateway
// while the tests' own psql keeps its direct path.
//
//   const px = await startPgProxy();
//   px.conninfo(dbname)   conninfo through the relay
//   await px.cut()        ends every relayed connection and refuses new ones
//   await px.restore()    accepts connections again (same port; nothing
//                         when it does already)
//   await px.close()

import net from 'node:net';
import path from 'node:path';

const PG_SOCK = process.env.LLMGW_PG_SOCK;
const PG_PORT = process.env.LLMGW_PG_PORT || '5432';

export async function startPgProxy() {
    const target = path.join(PG_SOCK, `.s.PGSQL.${PG_PORT}`);
    const open = new Set();
    let server = null;
    let port = 0;

    function relay(client) {
        const up = net.connect(target);
        open.add(client);
        open.add(up);
        const end = () => {
            client.destroy();
            up.destroy();
            open.delete(client);
            open.delete(up);
        };
        client.on('error', end).on('close', end);
        up.on('error', end).on('close', end);
        client.pipe(up);
        up.pipe(client);
    }

    async function listen() {
        if (server) {
            return;
        }
        server = net.createServer(relay);
        await new Promise((resolve, reject) => {
            server.once('error', reject);
            server.listen(port, '127.0.0.1', resolve);
        });
        port = server.address().port;
    }

    async function cut() {
        const s = server;
        server = null;
        for (const sock of open) {
            sock.destroy();
        }
        open.clear();
        if (s) {
            await new Promise((resolve) => s.close(resolve));
        }
    }

    await listen();

    return {
        get port() { return port; },
        conninfo: (dbname) =>
            `host=127.0.0.1 port=${port} dbname=${dbname} user=postgres`,
        cut,
        restore: listen,
        close: cut,
    };
}
