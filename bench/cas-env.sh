# Sourced by the cas commit benchmarks: `random_image DIR SIZE` leaves
# SIZE bytes of random data (nothing to deduplicate or compress) in
# DIR/disk.img, made once and reused while its size matches, and sets
# `img` and `bytes`.
random_image() {
  mkdir -p "$1"
  img="$1/disk.img"
  if [ ! -f "$img" ] || [ "$(stat -c %s "$img")" != "$(numfmt --from=iec "$2")" ]; then
    echo "creating $2 of random data in $img" >&2
    head -c "$2" /dev/urandom > "$img"
  fi
  bytes=$(stat -c %s "$img")
}
