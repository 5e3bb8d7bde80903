//! The Lua scripts, one per store call, so that each call is one atomic step on the server
//! and every timestamp is the server's (`TIME`).
//!
//! The acquire script also keeps the epoch guard (`EPOCH`): a replica that Sentinel (or an
//! operator) promotes may lack the last leases the old primary granted, so a new primary
//! grants nothing until every lease of the old one could have ended, and keeps tokens above
//! the old ones. The guard is read and written in the same script as the grant: no round trip
//! is added.

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

/// The epoch guard, for the acquire script (docs/safety.md, "A store's own failover").
///
/// The epoch is the `master_replid` of the server running the script: a promotion gives the
/// promoted replica a new one (and keeps the one it followed as `master_replid2`). The mark,
/// a hash with no expiry at `{prefix}epoch` (no lock's key can have that name: a lock's are
/// `{prefix}lock:NAME`, `{prefix}token:NAME` and `{prefix}wake:NAME`), holds the epoch leases
/// were last granted in, when it began (ms, server clock), the longest lease asked for since,
/// and whether the epoch began on an empty store (`fresh`).
///
/// `guard(mark, locks, ttl, now, unstated)` returns (ms the grace has left, fresh): a grant may
/// be made when the first is 0.
///
/// - A server that does not let the script run INFO (renamed, or not allowed to the user)
///   cannot state its epoch: the script fails with `NOINFO`, and the store runs it again with
///   `unstated` '1' (saying so once, `mod.rs`). The epoch is then the constant `unstated`, never
///   promoted: a mark written while the server did state its epoch starts one grace (it shows
///   another epoch), and none after that, so a promotion goes unnoticed.
/// - No mark: on an empty store (no `{prefix}locks` set, which every grant adds its lock to,
///   and a server that was not promoted since it started) a fresh epoch begins, with no grace;
///   otherwise (leases of an older leaderrun, a mark lost or never replicated) an epoch begins
///   with a grace.
/// - Another epoch in the mark: a grace begins, unless the server was not promoted and has its
///   append-only file on, which is a restart of the same server with its own data (Redis gives
///   a restarted server a new replication id too); the epoch is then only renamed, and a grace
///   under way goes on.
/// - The same epoch: the grace is over when the epoch is fresh, or once the longest lease asked
///   for (this one's included) has passed since it began.
const EPOCH: &str = r#"
local function epoch_mark(mark_key, epoch, began, longest, fresh)
  local f = '0'
  if fresh then f = '1' end
  redis.call('HSET', mark_key, 'epoch', epoch, 'began_ms', string.format('%d', began),
    'longest_ms', string.format('%d', longest), 'fresh', f)
end
local function guard(mark_key, locks_key, ttl, now, unstated)
  local epoch, promoted = 'unstated', false
  if unstated ~= '1' then
    local replication = redis.pcall('INFO', 'replication')
    if type(replication) == 'table' then
      error({err = 'NOINFO ' .. tostring(replication.err)})
    end
    epoch = string.match(replication, 'master_replid:(%x+)')
    if not epoch then
      error({err = 'NOINFO no master_replid in INFO replication (Redis 4.0 or later has it)'})
    end
    local previous = string.match(replication, 'master_replid2:(%x+)')
    promoted = previous ~= nil and string.match(previous, '^0+$') == nil
  end
  local mark = redis.call('HMGET', mark_key, 'epoch', 'began_ms', 'longest_ms', 'fresh')
  local began, longest = tonumber(mark[2]), tonumber(mark[3])
  if not (mark[1] and began and longest) then
    if redis.call('EXISTS', locks_key) == 0 and not promoted then
      epoch_mark(mark_key, epoch, now, ttl, true)
      return 0, true
    end
    epoch_mark(mark_key, epoch, now, ttl, false)
    return ttl, false
  end
  local fresh = mark[4] == '1'
  if mark[1] ~= epoch then
    local persistence = redis.pcall('INFO', 'persistence')
    local aof = type(persistence) == 'string' and string.match(persistence, 'aof_enabled:(%d)') == '1'
    if promoted or not aof then
      longest = math.max(longest, ttl)
      epoch_mark(mark_key, epoch, now, longest, false)
      return longest, false
    end
    redis.call('HSET', mark_key, 'epoch', epoch)
  end
  if ttl > longest then
    longest = ttl
    redis.call('HSET', mark_key, 'longest_ms', string.format('%d', longest))
  end
  if fresh then
    return 0, true
  end
  return math.max(0, began + longest - now), false
end
"#;

/// The scripts, each one atomic step on the server.
pub(super) struct Scripts {
    /// KEYS: lock, token, locks set, epoch mark. ARGV: name, identity, ttl_ms, channel, unstated
    /// ('1': the server's scripts cannot run INFO, see `EPOCH`).
    /// Returns {1, token} when won, {0, record...} when held, and {2, token, ms left} while a
    /// new primary waits out the leases of the old one.
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
            // The mark is brought up to date first, whatever the lock's state, so that a grace
            // starts at the first acquire the new primary sees. A lock held on the new primary
            // is reported as it is (its lease survived the failover); a free one, while the
            // grace lasts, as held by a lease the failover may have lost.
            acquire: Script::new(&format!(
                "{READ}\n{EPOCH}\n{}",
                r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left, fresh = guard(KEYS[4], KEYS[3], tonumber(ARGV[3]), now, ARGV[5])
if redis.call('EXISTS', KEYS[1]) == 1 then
  local r = read(KEYS[1], KEYS[2], ARGV[1])
  table.insert(r, 1, 0)
  return r
end
if left > 0 then
  return {2, tonumber(redis.call('GET', KEYS[2]) or '0'), left}
end
local token = redis.call('INCR', KEYS[2])
if not fresh then
  -- The counter may have gone back with the failover: a token is at least the clock in
  -- microseconds, far above the tokens of an epoch that began on an empty store.
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if now_us > token then
    token = now_us
    redis.call('SET', KEYS[2], string.format('%d', token))
  end
end
redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'token', string.format('%d', token),
  'acquired_ms', string.format('%d', now), 'revoked', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[1])
changed(ARGV[4], ARGV[1], 'taken')
return {1, token}
"#
            )),
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
