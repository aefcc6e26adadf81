# Sourced by bench/workload-replay.sh and bench/workload-replay-ab.sh: a
# temporary folder T (removed at exit, with any server still running), U
# (the NBD URI of $T/s.sock), and
#   desktop_traces BIN N   $T/desk.rdtrace (N requests of the desktop mix)
#                          and $T/desk50.rdtrace (N / 50 requests)
#   rps BIN ARGS...        requests/s of one `BIN replay ARGS...`
#   serve BIN SPEC         `BIN serve SPEC` on $T/s.sock, in the background
#   stop                   stop that server
T=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
U="nbd+unix:///?socket=$T/s.sock"
desktop_traces() {
  "$1" -q trace synth desktop --requests "$2" -o "$T/desk.rdtrace"
  "$1" -q trace synth desktop --requests $(($2 / 50)) -o "$T/desk50.rdtrace"
}
rps() { local r=$1; shift; "$r" -q replay "$@" | sed -n 's/.* s, \([0-9]*\) requests\/s.*/\1/p'; }
serve() {
  rm -f "$T/s.sock"
  "$1" -q serve "$2" --socket "$T/s.sock" & SERVER=$!
  for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.05; done
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=; }
