#!/bin/sh
# screenshots.sh - the README's pictures of `pgjobq serve`: a throwaway embedded database with a few
# hundred jobs (some failing, one with a hostile payload), a worker, the server, and headless
# Chromium.  Writes docs/img/overview.png and docs/img/job.png.  Usage: make screenshots
set -eu
PGJOBQ=${PGJOBQ:-build/pgjobq}
out=docs/img
home=$(mktemp -d /tmp/pgjobq-shots.XXXXXX)
chmod 755 "$home"
export PGJOBQ_HOME="$home"
unset PGJOBQ_DATABASE_URL DATABASE_URL
serve_pid= ; work_pid=
cleanup() {
    [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null || true
    [ -n "$work_pid" ] && kill "$work_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    "$PGJOBQ" db stop >/dev/null 2>&1 || true
    rm -rf "$home"
}
trap cleanup EXIT

"$PGJOBQ" db start >/dev/null
cat > "$home/handler.sh" <<'H'
#!/bin/sh
case "$PGJOBQ_QUEUE" in
sms) sleep 0.05; echo "provider answered 503 <html>Service Unavailable</html>" >&2; exit 1 ;;
reports) sleep 0.3 ;;
*) sleep 0.02 ;;
esac
H
chmod +x "$home/handler.sh"
i=0
while [ $i -lt 300 ]; do echo "{\"to\": \"user$i@example.org\"}"; i=$((i + 1)); done > "$home/mail.jsonl"
"$PGJOBQ" enqueue --queue mail --file "$home/mail.jsonl" --quiet
i=0
while [ $i -lt 12 ]; do "$PGJOBQ" enqueue --queue sms --max-attempts 1 '{"to": "+49 30 1234567"}' >/dev/null; i=$((i + 1)); done
i=0
while [ $i -lt 20 ]; do "$PGJOBQ" enqueue --queue reports --kind monthly '{"month": "2026-11"}' >/dev/null; i=$((i + 1)); done
id=$("$PGJOBQ" enqueue --queue sms --max-attempts 1 '{"to": "<script>alert(1)</script>"}')
"$PGJOBQ" enqueue --queue mail --delay 1h '{"digest": true}' >/dev/null
"$PGJOBQ" cron add nightly --schedule '0 3 * * *' --tz Europe/Berlin --queue reports --kind monthly >/dev/null
"$PGJOBQ" work --queue mail:8 --queue sms:2 --queue reports:2 --exec "$home/handler.sh" 2>"$home/work.log" &
work_pid=$!
"$PGJOBQ" serve --listen 127.0.0.1:0 2>"$home/serve.log" &
serve_pid=$!
sleep 6
"$PGJOBQ" queue pause reports --reason 'waiting for the month to close' >/dev/null
sleep 1
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\)\/.*/\1/p' "$home/serve.log")
shot() {
    timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$home/chrome" \
        --window-size=1280,"$2" --screenshot="$1" "http://127.0.0.1:$port$3" >/dev/null 2>&1
}
shot "$out/overview.png" 860 /
shot "$out/job.png" 900 "/jobs/$id"
echo "wrote $out/overview.png and $out/job.png"
