//! The Lua scripts, one per store call, so that each call is one atomic step on the server
//! and every timestamp is the server's (`TIME`).

use redis::Script;

/// Returns a lock's record as a flat array:
/// {name, held (0/1), holder, token, acquired_ms, ms left, revoked (0/1), kept (0/1)}.
/// KEYS: lock key, token key. ARGV[1]: the lock name.
const READ: &str = r#"
local function read(lock_key, token_key, name)
  local h = redis.call('HMGET', lock_key, 'holder', 'token', 'acquired_ms', 'revoked', 'kept')
  if not h[1] then
    return {name, 0, '', tonumber(redis.call('GET', token_key) or '0'), 0, 0, 0, 0}
  end
  local revoked, kept = 0, 0
  if h[4] == '1' then revoked = 1 end
  if h[5] == '1' then kept = 1 end
  return {name, 1, h[1], tonumber(h[2]), tonumber(h[3]), redis.call('PTTL', lock_key), revoked, kept}
end
-- Tell watchers (see observe.rs) that a lock changed without being freed: on the channel
-- releases are published on, with a payload that is never a lock name (a name has no
-- newline), so that a waiter listening there for its lock's name ignores it.
local function changed(channel, name, what)
  redis.call('PUBLISH', channel, name .. '\n' .. what)
end
-- Hand one waiter blocked in BLPOP on the wake list its turn (see wake.rs): the list keeps
-- at most one element, for ms milliseconds, if nobody is blocked.
local function wake(wake_key, ms)
  redis.call('RPUSH', wake_key, '1')
  redis.call('LTRIM', wake_key, -1, -1)
  redis.call('PEXPIRE', wake_key, ms)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// The scripts, each one atomic step on the server.
pub(super) struct Scripts {
    /// KEYS: lock, token, locks set. ARGV: name, identity, ttl_ms, channel.
    /// Returns {1, token} when won, else {0, record...}.
    pub(super) acquire: Script,
    /// KEYS: lock, token. ARGV: name, identity, token, ttl_ms. Returns {1} or {0, record...}.
    pub(super) renew: Script,
    /// KEYS: lock, wake list. ARGV: name, identity, token, keep_ms, channel, wake_keep_ms.
    /// Returns 0 (not ours), 1 (kept for --min-hold: marked `kept`) or 2 (freed).
    pub(super) release: Script,
    /// KEYS: lock, token. ARGV: name. Returns the record.
    pub(super) status: Script,
    /// KEYS: locks set. ARGV: prefix. Returns every record, flattened.
    pub(super) list: Script,
    /// KEYS: lock, token, wake list. ARGV: name, channel, wake_keep_ms. Returns the record
    /// before (held = 0: nothing done).
    pub(super) revoke: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        let script = |body: &str| Script::new(&format!("{READ}\n{body}"));
        Self {
            acquire: script(
                r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  local r = read(KEYS[1], KEYS[2], ARGV[1])
  table.insert(r, 1, 0)
  return r
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'token', string.format('%d', token),
  'acquired_ms', string.format('%d', now_ms()), 'revoked', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[1])
changed(ARGV[4], ARGV[1], 'taken')
return {1, token}
"#,
            ),
            // A lease released with a keep was given up: it is never extended again, so that
            // `revoke` may free it at once (see there).
            renew: script(
                r#"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'revoked', 'kept')
if h[1] == ARGV[2] and h[2] == ARGV[3] and h[3] ~= '1' and h[4] ~= '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1}
end
local r = read(KEYS[1], KEYS[2], ARGV[1])
table.insert(r, 1, 0)
return r
"#,
            ),
            // With keep > 0 (--min-hold) the key stays, with its holder, until
            // acquired_ms + keep if that is still ahead, marked `kept`: its child is gone;
            // otherwise it goes, and waiters are told: one by the wake list, older ones on the
            // channel (where watchers hear of both).
            release: script(
                r#"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_ms')
if h[1] ~= ARGV[2] or h[2] ~= ARGV[3] then
  return 0
end
local keep_until = tonumber(h[3]) + tonumber(ARGV[4])
if tonumber(ARGV[4]) > 0 and keep_until > now_ms() then
  redis.call('HSET', KEYS[1], 'kept', '1')
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', keep_until))
  changed(ARGV[5], ARGV[1], 'kept')
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[5], ARGV[1])
wake(KEYS[2], ARGV[6])
return 2
"#,
            ),
            status: script("return read(KEYS[1], KEYS[2], ARGV[1])"),
            list: script(
                r#"
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  for _, v in ipairs(read(ARGV[1] .. 'lock:' .. name, ARGV[1] .. 'token:' .. name, name)) do
    table.insert(out, v)
  end
end
return out
"#,
            ),
            // A live lease is only marked: its PX expiry stays, and the holder frees the lock
            // once its child is stopped, or the lease lapses. A lease only kept for --min-hold
            // has no child and no holder left to free it: it goes at once, and waiters are told.
            revoke: script(
                r#"
local r = read(KEYS[1], KEYS[2], ARGV[1])
if r[2] == 1 then
  if redis.call('HGET', KEYS[1], 'kept') == '1' then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], ARGV[1])
    wake(KEYS[3], ARGV[3])
  else
    redis.call('HSET', KEYS[1], 'revoked', '1')
    changed(ARGV[2], ARGV[1], 'revoked')
  end
end
return r
"#,
            ),
        }
    }
}
