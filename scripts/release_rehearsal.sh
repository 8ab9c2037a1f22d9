#!/usr/bin/env bash
# Rehearse a release end to end with the real artifacts and no outside service:
#   build -> validate -> release to a local S3 (moto on 127.0.0.1) -> release again
#   (idempotent) -> fetch from the published URLs -> bundle -> fetch offline from the
#   bundle -> wheel -> install it offline into a fresh venv -> resolve both platforms.
# It refuses like the real release does (a dirty tree, unvalidated bytes), and never
# touches the package's published manifest (--no-package-manifest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH"

work=$(mktemp -d /tmp/sandbox-tools-rehearsal.XXXXXX)
moto_pid=""
# The release writes dist/manifest.json (with the stand-in's URLs) and dist/SHA256SUMS:
# put back what was there before.
touched=(manifest.json SHA256SUMS)
for name in "${touched[@]}"; do
  if [ -e "dist/$name" ]; then cp -p "dist/$name" "$work/$name.before"; fi
done
cleanup() {
  [ -n "$moto_pid" ] && kill "$moto_pid" 2>/dev/null || true
  for name in "${touched[@]}"; do
    if [ -e "$work/$name.before" ]; then
      cp -p "$work/$name.before" "dist/$name"
    else
      rm -f "dist/$name"
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "build (a no-op when the sources are unchanged)"
tools build --all

step "validate both architectures"
tools validate --report "$work/validate-report.json" --junit "$work/validate-junit.xml"

step "a local S3 on 127.0.0.1 (moto server mode)"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto_pid=$!
endpoint="http://127.0.0.1:$port"
export AWS_ACCESS_KEY_ID=rehearsal AWS_SECRET_ACCESS_KEY=rehearsal AWS_DEFAULT_REGION=us-east-1
for _ in $(seq 100); do curl -fs "$endpoint" >/dev/null 2>&1 && break; sleep 0.1; done
python3 - "$endpoint" <<'PY'
import sys
import boto3
boto3.client("s3", endpoint_url=sys.argv[1]).create_bucket(Bucket="sandbox-tools-rehearsal")
PY

# Public-read, as a real bucket must be readable by its users (an ACL here; a bucket
# policy in production): the fetch below is anonymous, as a user's is.
release=(tools release --s3-bucket sandbox-tools-rehearsal --s3-endpoint-url "$endpoint"
         --s3-public-read --validate-report "$work/validate-report.json" --no-package-manifest)
step "release"
"${release[@]}"
step "release again: everything identical, nothing uploaded"
"${release[@]}"

step "fetch from the published URLs"
tools fetch --manifest dist/manifest.json --dest "$work/fetched"
(cd "$work/fetched" && sha256sum -c "$OLDPWD/dist/SHA256SUMS")

step "bundle, then fetch offline from it"
tools bundle create --out "$work/carry/sandbox-tools.tar"
HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
  tools fetch --manifest dist/manifest.json --from "$work/carry/sandbox-tools.tar" --dest "$work/offline"

step "the wheel, installed offline into a fresh venv, resolves both platforms"
tools wheel --manifest dist/manifest.json --out "$work/wheel"
python3 -m venv --without-pip "$work/venv"
PIP_CONFIG_FILE=/dev/null .venv/bin/python -m pip --python "$work/venv/bin/python" \
  install --quiet --no-index --no-deps "$work"/wheel/*.whl
(cd "$work" && HOME="$work" SANDBOX_TOOLS_OFFLINE=1 "$work/venv/bin/python" - <<'PY'
from sandbox_tools.injector.acquire import acquire_artifact
from sandbox_tools.platforms import Arch

for arch in Arch:
    found = acquire_artifact(arch)
    print(f"{arch.platform}: {found.name} ({found.provenance}) sha256 {found.sha256[:16]}... at {found.path}")
PY
)
step "rehearsal complete"
