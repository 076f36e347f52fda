#!/bin/sh
# Starts the relay's Redis with its users kept in an ACL file, so that the hospitals' and
# the workers' Redis users survive a restart of a relay that keeps no data: the
# coordinator runs ACL SAVE after each change (hospitals.relay_acl.RedisAclUsers).
# The default user (the coordinator's, with the ACL and CLIENT commands) is set from
# REDIS_PASSWORD at every start, so changing the password takes one restart.
# Extra arguments go to redis-server.
set -eu
: "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
acl="${REDIS_ACL_FILE:-/data/users.acl}"
umask 077
touch "$acl"
hash=$(printf %s "$REDIS_PASSWORD" | sha256sum | cut -d' ' -f1)
{ grep -v '^user default ' "$acl" || true; echo "user default on #$hash ~* &* +@all"; } > "$acl.new"
mv "$acl.new" "$acl"
exec "${REDIS_SERVER:-redis-server}" --aclfile "$acl" --save "" --appendonly no "$@"
