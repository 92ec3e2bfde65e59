// A small JSON-over-HTTP call for the benchmark scripts (admin API and
// probes): one connection per call, bounded by a timeout.

import http from 'node:http';

export function request(base, token, method, path, body, timeoutMs = 10000) {
    return new Promise((resolve, reject) => {
        const u = new URL(base + path);
        const payload = body === undefined ? undefined
            : (typeof body === 'string' ? body : JSON.stringify(body));
        const headers = { Authorization: `Bearer ${token}` };
        if (payload !== undefined) {
            headers['Content-Type'] = 'application/json';
            headers['Content-Length'] = Buffer.byteLength(payload);
        }
        const req = http.request({
            host: u.hostname, port: u.port, path: u.pathname + u.search,
            method, headers, agent: false, timeout: timeoutMs,
        }, (res) => {
            const parts = [];
            res.on('data', (c) => parts.push(c));
            res.on('end', () => {
                const text = Buffer.concat(parts).toString('utf8');
                let json;
                try {
                    json = JSON.parse(text);
                } catch {
                    json = undefined;
                }
                resolve({ status: res.statusCode, text, json });
            });
            res.on('error', reject);
        });
        req.on('timeout', () => req.destroy(new Error(`${method} ${path}: timeout`)));
        req.on('error', reject);
        req.end(payload);
    });
}
