#!/bin/sh
# Starts the relay's Redis with its users kept in an ACL file, so that the hospitals' and
# the workers' Redis users survive a restart of a relay that keeps no data: the
# coordinator runs ACL SAVE after each change (hospitals.relay_acl.RedisAclUsers).
# The default user (the coordinator's, with the ACL and CLIENT commands) is set from
# REDIS_PASSWORD at every start, so changing the password takes one restart.
#
# Backstops (docs/deploy.md, "The relay's memory"): at REDIS_MAXMEMORY (default 1gb) Redis
# refuses writes rather than evicting anything (noeviction: a frame or a hand-off is never
# dropped silently), and no single value may exceed REDIS_MAX_VALUE (default 64mb; frames
# cross in 4 MiB chunks). Extra arguments go to redis-server.
set -eu
: "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
# Redis answers tens of thousands of AUTH guesses a second: only a machine secret will do.
distinct=$(printf %s "$REDIS_PASSWORD" | fold -w1 | sort -u | wc -l)
if [ "${#REDIS_PASSWORD}" -lt 32 ] || [ "$distinct" -lt 16 ]; then
  echo "redis-start.sh: REDIS_PASSWORD is too weak to guard the relay (${#REDIS_PASSWORD}" \
    "characters, $distinct different): use at least 32 characters, 16 of them different," \
    "made with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'" >&2
  exit 2
fi
acl="${REDIS_ACL_FILE:-/data/users.acl}"
umask 077
touch "$acl"
hash=$(printf %s "$REDIS_PASSWORD" | sha256sum | cut -d' ' -f1)
{ grep -v '^user default ' "$acl" || true; echo "user default on #$hash ~* &* +@all"; } > "$acl.new"
mv "$acl.new" "$acl"
exec "${REDIS_SERVER:-redis-server}" --aclfile "$acl" --save "" --appendonly no \
  --maxmemory "${REDIS_MAXMEMORY:-1gb}" --maxmemory-policy noeviction \
  --proto-max-bulk-len "${REDIS_MAX_VALUE:-64mb}" "$@"
