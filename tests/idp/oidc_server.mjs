// Test-only OpenID Connect provider (npm `oidc-provider`) for the portal's SSO tests.
//
//   node tests/idp/oidc_server.mjs CONFIG.json        (or OIDC_SERVER_CONFIG=CONFIG.json)
//
// CONFIG.json:
//   {
//     "host": "127.0.0.2",            loopback address to listen on
//     "port": 0,                      0 = any free port (the issuer then gets the real one)
//     "issuer": "http://...",         optional; default http://<host>:<port>
//     "name": "Institution A",        shown on the login page
//     "ready_file": "/tmp/.../ready.json",   written once listening: {"issuer", "host", "port", "pid"}
//     "clients":  [{"client_id", "client_secret", "redirect_uris": [...],
//                   "token_endpoint_auth_method": "client_secret_post" (default) | "client_secret_basic",
//                   ...any other client metadata}],
//     "accounts": [{"sub", "email", "email_verified", "name", "password", "login" (optional)}]
//   }
//
// `clients` and `accounts` are re-read from CONFIG.json whenever the file changes, so a test can
// register the portal's callback URL after the provider has started (the portal's provider id, and
// so its callback path, depends on the issuer, which includes the port). Replace the file atomically.
//
// Login is a real form at /interaction/<uid> (fields `login` and `password`, checked against
// `accounts`; `login` matches an account's `login`, `sub` or `email`). Consent is granted
// automatically for the requested scopes (all clients are first-party here).
//
// Plain HTTP on a non-localhost loopback address is fine for oidc-provider: it marks cookies `secure`
// only when the request itself is secure, and no proxy is involved (`proxy` stays off).
// NOT FOR PRODUCTION: in-memory storage, a fresh signing key and cookie key per start.

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';

import Provider from 'oidc-provider';

const configPath = process.argv[2] || process.env.OIDC_SERVER_CONFIG;
if (!configPath) {
  console.error('usage: node oidc_server.mjs CONFIG.json  (or set OIDC_SERVER_CONFIG)');
  process.exit(2);
}

let cached = { ino: -1, mtimeMs: -1, size: -1, data: null };
function readConfig() {
  const st = fs.statSync(configPath);
  if (st.ino !== cached.ino || st.mtimeMs !== cached.mtimeMs || st.size !== cached.size
    || cached.data === null) {
    cached = { ino: st.ino, mtimeMs: st.mtimeMs, size: st.size, data: JSON.parse(fs.readFileSync(configPath, 'utf8')) };
  }
  return cached.data;
}

const log = (...args) => console.log(new Date().toISOString(), ...args);

function clientMetadata(client) {
  const {
    client_id: clientId, client_secret: clientSecret, redirect_uris: redirectUris, ...rest
  } = client;
  return {
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: redirectUris ?? [],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_post',
    ...rest,
  };
}

function findConfiguredAccount(predicate) {
  return (readConfig().accounts ?? []).find(predicate);
}

function accountByLogin(login) {
  const wanted = String(login ?? '').trim();
  if (!wanted) return undefined;
  return findConfiguredAccount((a) => (a.login !== undefined ? a.login === wanted : false)
    || a.sub === wanted
    || (a.email && a.email.toLowerCase() === wanted.toLowerCase()));
}

function passwordMatches(account, password) {
  const a = Buffer.from(String(account.password ?? ''));
  const b = Buffer.from(String(password ?? ''));
  return a.length === b.length && crypto.timingSafeEqual(a, b);
}

// ---------------------------------------------------------------------------------------------
// Storage: an in-memory adapter for everything but clients, which come from CONFIG.json.

const store = new Map(); // key -> { payload, expiresAt }
const grantMembers = new Map(); // grantId -> Set(key)
const grantable = new Set(['AccessToken', 'AuthorizationCode', 'RefreshToken', 'DeviceCode',
  'BackchannelAuthenticationRequest']);

function live(key) {
  const entry = store.get(key);
  if (!entry) return undefined;
  if (entry.expiresAt !== undefined && entry.expiresAt <= Date.now()) {
    store.delete(key);
    return undefined;
  }
  return entry.payload;
}

class MemoryAdapter {
  constructor(model) {
    this.model = model;
  }

  key(id) {
    return `${this.model}:${id}`;
  }

  async upsert(id, payload, expiresIn) {
    const key = this.key(id);
    const expiresAt = typeof expiresIn === 'number' ? Date.now() + expiresIn * 1000 : undefined;
    store.set(key, { payload, expiresAt });
    if (this.model === 'Session' && payload.uid) {
      store.set(`sessionUid:${payload.uid}`, { payload: id, expiresAt });
    }
    if (payload.userCode) {
      store.set(`userCode:${payload.userCode}`, { payload: id, expiresAt });
    }
    if (grantable.has(this.model) && payload.grantId) {
      if (!grantMembers.has(payload.grantId)) grantMembers.set(payload.grantId, new Set());
      grantMembers.get(payload.grantId).add(key);
    }
  }

  async find(id) {
    return live(this.key(id));
  }

  async findByUid(uid) {
    const id = live(`sessionUid:${uid}`);
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode(userCode) {
    const id = live(`userCode:${userCode}`);
    return id === undefined ? undefined : this.find(id);
  }

  async consume(id) {
    const payload = live(this.key(id));
    if (payload) payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    for (const key of grantMembers.get(grantId) ?? []) store.delete(key);
    grantMembers.delete(grantId);
  }
}

class ConfigClientAdapter extends MemoryAdapter {
  async find(id) {
    const client = (readConfig().clients ?? []).find((c) => c.client_id === id);
    return client ? clientMetadata(client) : undefined;
  }
}

// ---------------------------------------------------------------------------------------------
// HTML

const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ({
  '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
}[c]));

function page(title, body) {
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>${esc(title)}</title>
<style>body{font-family:sans-serif;max-width:28em;margin:3em auto}label{display:block;margin:.6em 0}
input{width:100%;padding:.3em}.error{color:#b00020}</style></head>
<body>${body}</body></html>`;
}

function loginPage({ uid, clientId, name, login = '', error = '' }) {
  return page(`Sign in – ${name}`, `
<h1>${esc(name)}</h1>
<p>Sign in to continue to <strong>${esc(clientId)}</strong>.</p>
${error ? `<p class="error" role="alert">${esc(error)}</p>` : ''}
<form method="post" action="/interaction/${esc(uid)}/login" autocomplete="off">
  <label>Username <input name="login" id="login" value="${esc(login)}" required autofocus></label>
  <label>Password <input type="password" name="password" id="password" required></label>
  <button type="submit">Sign in</button>
</form>
<p><a href="/interaction/${esc(uid)}/abort">Cancel</a></p>`);
}

function send(res, status, html) {
  res.statusCode = status;
  res.setHeader('Content-Type', 'text/html; charset=utf-8');
  res.setHeader('Cache-Control', 'no-store');
  res.end(html);
}

async function readForm(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 64 * 1024) throw new Error('form too large');
    chunks.push(chunk);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

// ---------------------------------------------------------------------------------------------
// Interactions

async function grantConsent(provider, details) {
  const { prompt: { details: missing }, params, session } = details;
  let grant;
  if (details.grantId) {
    grant = await provider.Grant.find(details.grantId);
  } else {
    grant = new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  }
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  if (missing.missingResourceScopes) {
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes)) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
  }
  const grantId = await grant.save();
  return details.grantId ? {} : { grantId };
}

async function handleInteraction(provider, req, res, uid, action) {
  const name = readConfig().name || 'Test identity provider';
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) {
    send(res, 400, page('Error', '<p>Interaction mismatch.</p>'));
    return;
  }
  const promptName = details.prompt.name;

  if (action === 'abort') {
    await provider.interactionFinished(req, res, {
      error: 'access_denied', error_description: 'End-User aborted interaction',
    }, { mergeWithLastSubmission: false });
    return;
  }

  if (promptName === 'login') {
    if (action === 'login' && req.method === 'POST') {
      const form = await readForm(req);
      const account = accountByLogin(form.get('login'));
      if (!account || !passwordMatches(account, form.get('password'))) {
        log(`login failed for ${JSON.stringify(form.get('login'))}`);
        send(res, 401, loginPage({
          uid, clientId: details.params.client_id, name, login: form.get('login') ?? '',
          error: 'Invalid username or password.',
        }));
        return;
      }
      log(`login ok: sub=${account.sub} client=${details.params.client_id}`);
      await provider.interactionFinished(req, res, {
        login: { accountId: account.sub, amr: ['pwd'] },
      }, { mergeWithLastSubmission: false });
      return;
    }
    send(res, 200, loginPage({ uid, clientId: details.params.client_id, name }));
    return;
  }

  if (promptName === 'consent') {
    const consent = await grantConsent(provider, details);
    await provider.interactionFinished(req, res, { consent }, { mergeWithLastSubmission: true });
    return;
  }

  send(res, 400, page('Error', `<p>Unsupported prompt ${esc(promptName)}.</p>`));
}

// ---------------------------------------------------------------------------------------------
// Start

const initial = readConfig();
const host = initial.host || '127.0.0.1';
const server = http.createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(initial.port ?? 0, host, resolve);
});
const { port } = server.address();
const issuer = (initial.issuer || `http://${host}:${port}`).replace(/\/$/, '');

const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), use: 'sig', alg: 'RS256' };
signingKey.kid = crypto.createHash('sha256')
  .update(JSON.stringify({ e: signingKey.e, kty: 'RSA', n: signingKey.n })).digest('base64url');

const provider = new Provider(issuer, {
  adapter: (model) => (model === 'Client' ? new ConfigClientAdapter(model) : new MemoryAdapter(model)),
  async findAccount(ctx, sub) {
    const account = findConfiguredAccount((a) => a.sub === sub);
    if (!account) return undefined;
    return {
      accountId: sub,
      async claims() {
        return {
          sub,
          email: account.email,
          email_verified: account.email_verified ?? true,
          name: account.name,
        };
      },
    };
  },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
  },
  scopes: ['openid', 'email', 'profile'],
  // Put the scope-granted claims (email, name) into the ID token too, as most institutional IdPs do.
  conformIdTokenClaims: false,
  cookies: { keys: [crypto.randomBytes(32).toString('base64url')] },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  jwks: { keys: [signingKey] },
  // Default PKCE policy: required for public clients only; confidential clients may or may not
  // send code_challenge (S256). When they do, the code_verifier is checked.
  async renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = page('Error', `<h1>Error</h1>${Object.entries(out)
      .map(([k, v]) => `<p><strong>${esc(k)}</strong>: ${esc(v)}</p>`).join('')}`);
  },
});

provider.on('server_error', (ctx, err) => log('server_error', err));
provider.on('authorization.error', (ctx, err) => log('authorization.error', err.message, err.error_description ?? ''));
provider.on('grant.error', (ctx, err) => log('grant.error', err.message, err.error_description ?? ''));
provider.on('grant.success', (ctx) => log('grant.success', ctx.oidc.client?.clientId));

const oidcCallback = provider.callback();
const interactionRoute = /^\/interaction\/([A-Za-z0-9_-]+)(?:\/(login|abort))?\/?$/;

server.on('request', async (req, res) => {
  const { pathname } = new URL(req.url, issuer);
  const match = interactionRoute.exec(pathname);
  log(req.method, req.url.split('?')[0]);
  if (!match) {
    oidcCallback(req, res);
    return;
  }
  try {
    await handleInteraction(provider, req, res, match[1], match[2]);
  } catch (err) {
    log('interaction error', err);
    if (!res.headersSent) {
      send(res, err.statusCode ?? 500, page('Error', `<p>${esc(err.error_description || err.message)}</p>`));
    } else {
      res.end();
    }
  }
});

// Fail fast on invalid client metadata instead of at the first authorization request.
for (const client of initial.clients ?? []) {
  try {
    await provider.Client.find(client.client_id);
  } catch (err) {
    console.error(`invalid client ${client.client_id}: ${err.message} ${err.error_description ?? ''}`);
    process.exit(3);
  }
}

const ready = { issuer, host, port, pid: process.pid };
if (initial.ready_file) {
  fs.writeFileSync(`${initial.ready_file}.tmp`, JSON.stringify(ready));
  fs.renameSync(`${initial.ready_file}.tmp`, initial.ready_file);
}
log(`READY ${JSON.stringify(ready)}`);

const shutdown = (signal) => {
  log(`${signal}: shutting down`);
  server.close(() => process.exit(0));
  server.closeAllConnections();
  setTimeout(() => process.exit(0), 2000).unref();
};
process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));
