#!/usr/bin/env bash
# Rehearse a release end to end with the real artifacts and no outside service:
#   build -> validate -> release to a local S3 (moto on 127.0.0.1) and the GitHub stand-in
#   (tests/release/servers.py on 127.0.0.1): refused while the tag is missing, a draft
#   with --github-draft, then, once the tag is pushed, the same command publishes the
#   draft (everything else identical, nothing uploaded) -> fetch from the published URLs
#   -> fetch anonymously from the stand-in's download URLs -> bundle -> fetch offline from
#   the bundle -> wheel -> install it offline into a fresh venv -> resolve both platforms.
# It refuses like the real release does (a dirty tree, unvalidated bytes, a bucket users
# cannot read, a required distribution not validated, a GitHub tag that does not exist),
# and never touches the package's published manifest (--no-package-manifest). Everything
# it writes outside a scratch directory (dist/manifest.json, dist/SHA256SUMS) is put back
# as it was, however it ends; both servers are stopped.
#
# Options (each variant of docs/RELEASING.md):
#   --with-browser   build the browser add-on of both platforms too: validate runs its
#                    browser cells, the release carries it, fetch and the bundle have it
#   --only DISTRO    validate these rows only (repeatable; debian-12, which the rehearsal
#                    requires, is always among them); default: the whole matrix
set -euo pipefail
cd "$(dirname "$0")/.."
with_browser=()
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --with-browser) with_browser=(--with-browser); shift ;;
    --only) [ $# -ge 2 ] || { echo "--only needs a distribution, e.g. --only busybox" >&2; exit 2; }
            only+=(--only "$2"); shift 2 ;;
    *) echo "unknown option $1 (options: --with-browser, --only DISTRO)" >&2; exit 2 ;;
  esac
done
if [ ${#only[@]} -gt 0 ]; then only+=(--only debian-12); fi
bash scripts/setup.sh >/dev/null
export PATH="$PWD/.venv/bin:$PATH"

work=$(mktemp -d /tmp/sandbox-tools-rehearsal.XXXXXX)
moto_pid=""
github_pid=""
# The release writes dist/manifest.json (with the stand-in's URLs) and dist/SHA256SUMS:
# put back what was there before.
touched=(manifest.json SHA256SUMS)
for name in "${touched[@]}"; do
  if [ -e "dist/$name" ]; then cp -p "dist/$name" "$work/$name.before"; fi
done
cleanup() {
  [ -n "$moto_pid" ] && kill "$moto_pid" 2>/dev/null || true
  [ -n "$github_pid" ] && kill "$github_pid" 2>/dev/null || true
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
fail() { cat "$@" >&2; exit 1; }
version=$(python3 -c 'import sandbox_tools; print(sandbox_tools.__version__)')

step "build (a no-op when the sources are unchanged)"
tools build --all "${with_browser[@]}"
addons=$(python3 -c 'import json; print(sum(1 for a in json.load(open("dist/build.json"))["artifacts"] if a.get("kind") == "browser"))')
if [ ${#with_browser[@]} -gt 0 ] && [ "$addons" != 2 ]; then
  fail <(echo "expected the browser add-on of both platforms in dist/build.json; found $addons")
fi
if [ "$addons" -gt 0 ] && [ ${#with_browser[@]} = 0 ]; then
  # An earlier --with-browser build left them: the release carries what dist/ holds.
  echo "dist/ holds $addons browser add-ons from an earlier build: rehearsing with them"
  with_browser=(--with-browser)
fi

step "validate both architectures${with_browser:+, with the browser cells of the add-ons}"
tools validate "${only[@]}" --report "$work/validate-report.json" --junit "$work/validate-junit.xml"
if [ "$addons" -gt 0 ]; then
  python3 - "$work/validate-report.json" <<'PY'
import json
import sys

report = json.load(open(sys.argv[1]))
cells = [c for c in report["results"] if c["scenario"].startswith("browser-")]
passed = sorted(c["id"] for c in cells if c["status"] == "passed")
platforms = {c["platform"] for c in cells if c["status"] == "passed"}
assert platforms == {"linux/amd64", "linux/arm64"}, f"browser cells passed on {platforms}"
print(f"browser cells passed: {', '.join(passed)}")
PY
fi

# A release is made from a committed tree, and refuses anything else. While this
# checkout has uncommitted changes (yours, or a teammate's in a shared checkout), the
# rehearsal shows that refusal, then goes on with a snapshot of the working tree committed
# in a scratch repository (the tree the release would be made from once committed).
# Only read-only git commands touch this checkout.
tree="$PWD"
if [ -n "$(GIT_OPTIONAL_LOCKS=0 git status --porcelain)" ]; then
  step "uncommitted changes: the release refuses this tree"
  set +e
  tools release --dry-run --s3-bucket unused --s3-endpoint-url http://127.0.0.1:9 \
    --validate-report "$work/validate-report.json" --no-package-manifest \
    >"$work/dirty.out" 2>"$work/dirty.err"
  code=$?
  set -e
  grep -q "uncommitted changes" "$work/dirty.err" && [ "$code" = 11 ] \
    || { cat "$work/dirty.out" "$work/dirty.err"; echo "expected a refusal (exit 11), got $code" >&2; exit 1; }
  head -n 1 "$work/dirty.err"
  tree="$work/tree"
  mkdir -p "$tree"
  git ls-files -z --cached --others --exclude-standard \
    | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -C "$tree" -xf -
  git -C "$tree" init -q
  git -C "$tree" add -A
  git -C "$tree" -c user.name=rehearsal -c user.email=rehearsal@invalid commit -qm snapshot
  echo "rehearsing with a snapshot of the working tree, committed in $tree"
fi

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
client = boto3.client("s3", endpoint_url=sys.argv[1])
client.create_bucket(Bucket="sandbox-tools-rehearsal")
client.create_bucket(Bucket="sandbox-tools-rehearsal-private")
PY

step "a GitHub stand-in on 127.0.0.1 (tests/release/servers.py), with a token"
export GITHUB_TOKEN=rehearsal-token
python3 -m tests.release.servers github --token "$GITHUB_TOKEN" \
  >"$work/github.url" 2>"$work/github.log" &
github_pid=$!
for _ in $(seq 100); do [ -s "$work/github.url" ] && break; sleep 0.1; done
github_url=$(cat "$work/github.url")
[ -n "$github_url" ] || fail "$work/github.log"
repo=rehearsal/sandbox-tools
tag="v$version"
github=(--github-repo "$repo" --github-api-url "$github_url" --github-web-url "$github_url")
echo "$github_url (repository $repo; no tag $tag yet)"

common=(--s3-endpoint-url "$endpoint" --validate-report "$work/validate-report.json"
        --checkout "$tree" --no-package-manifest)
step "a bucket users cannot read: refused after one object, with the remedy"
set +e
tools release --s3-bucket sandbox-tools-rehearsal-private "${common[@]}" \
  >"$work/private.out" 2>"$work/private.err"
code=$?
set -e
grep -q "users cannot download it: HTTP 403" "$work/private.err" && [ "$code" = 11 ] \
  || { cat "$work/private.out" "$work/private.err"; echo "expected a refusal (exit 11), got $code" >&2; exit 1; }
grep -E "^(error|what to do):" "$work/private.err"

# A row this machine could not run (its image unavailable), if there is one.
skipped=$(python3 - "$work/validate-report.json" <<'PY'
import json
import sys

report = json.load(open(sys.argv[1]))
print(next((c["distro"] for c in report["results"]
            if c["status"] == "skipped" and not c["detail"].startswith("no shell")), ""))
PY
)
if [ -n "$skipped" ]; then
  step "requiring $skipped, which was skipped here: refused"
  set +e
  tools release --dry-run --s3-bucket sandbox-tools-rehearsal "${common[@]}" \
    --require "$skipped" >"$work/require.out" 2>"$work/require.err"
  code=$?
  set -e
  grep -q "required distributions were not validated in full" "$work/require.err" \
    && [ "$code" = 11 ] \
    || { cat "$work/require.out" "$work/require.err"; echo "expected a refusal (exit 11), got $code" >&2; exit 1; }
  head -n 2 "$work/require.err"
fi

# Public-read, as a real bucket must be readable by its users (an ACL here; a bucket
# policy in production): the release checks it, and the fetch below is anonymous, as a
# user's is. debian-12 validates offline (debootstrap), so it can be required here.
release=(tools release --version "$version" --s3-bucket sandbox-tools-rehearsal --s3-public-read
         --require debian-12 "${github[@]}" "${common[@]}")
step "a GitHub release on a tag that does not exist: refused before anything is uploaded"
set +e
"${release[@]}" >"$work/no-tag.out" 2>"$work/no-tag.err"
code=$?
set -e
grep -q "the tag $tag does not exist in $repo" "$work/no-tag.err" && [ "$code" = 11 ] \
  || fail "$work/no-tag.out" "$work/no-tag.err" <(echo "expected a refusal (exit 11), got $code")
grep -E "^(error|what to do):" "$work/no-tag.err"

step "release with --github-draft: S3 published, the GitHub release uploaded and verified as a draft"
"${release[@]}" --github-draft | tee "$work/draft.out"
grep -q "the GitHub release is a draft" "$work/draft.out" || fail "$work/draft.out"
# What the release publishes (runtimes, add-ons, SHA256SUMS and the manifest, in each
# place): counted from what the draft uploaded, never a number written here.
published=$(grep -c ': uploaded$' "$work/draft.out" || true)
[ "$published" -gt 0 ] || fail "$work/draft.out" <(echo "the draft uploaded nothing")

step "the tag pushed (created on the stand-in, at the released commit)"
sha=$(git -C "$tree" rev-parse HEAD)
curl -fsS -X POST -H "Authorization: Bearer $GITHUB_TOKEN" \
  "$github_url/repos/$repo/git/refs" -d "{\"ref\": \"refs/tags/$tag\", \"sha\": \"$sha\"}" >/dev/null
echo "$tag -> $sha"

step "the same command without --github-draft: everything identical, the draft published"
"${release[@]}" | tee "$work/publish.out"
uploaded=$(grep -c ': uploaded$' "$work/publish.out" || true)
identical=$(grep -c ': skipped (identical)$' "$work/publish.out" || true)
[ "$uploaded" = 0 ] && [ "$identical" = "$published" ] \
  || fail "$work/publish.out" <(echo "expected $published identical, 0 uploaded; got $identical, $uploaded")
curl -fsS -H "Authorization: Bearer $GITHUB_TOKEN" "$github_url/repos/$repo/releases/tags/$tag" \
  | python3 -c 'import json, sys; r = json.load(sys.stdin); assert r["draft"] is False, r; print(r["tag_name"] + ": published")'

# What each fetch must have: the runtimes, and the browser add-ons when the release
# carries them (then SHA256SUMS lists them too, and every line is checked). A desktop
# add-on a test built into dist/ is not released (releases do not carry it yet).
artifacts=$(python3 -c 'import json; print(sum(1 for a in json.load(open("dist/build.json"))["artifacts"] if a.get("kind", "runtime") in ("runtime", "browser")))')
step "fetch from the published URLs (the manifest's order: S3 first)"
tools fetch --manifest dist/manifest.json --dest "$work/fetched" "${with_browser[@]}"
(cd "$work/fetched" && sha256sum -c "$OLDPWD/dist/SHA256SUMS")

step "fetch anonymously from the GitHub stand-in's download URLs"
download="$github_url/$repo/releases/download/$tag"
env -u GITHUB_TOKEN -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY \
  tools fetch --manifest dist/manifest.json --mirror "$download" --out "$work/from-github" \
  "${with_browser[@]}" | tee "$work/from-github.out"
[ "$(grep -c ": fetched from $download/" "$work/from-github.out" || true)" = "$artifacts" ] \
  || fail "$work/from-github.out" <(echo "expected the $artifacts artifacts fetched from $download")
(cd "$work/from-github" && sha256sum -c "$OLDPWD/dist/SHA256SUMS")

step "bundle, then fetch offline from it"
tools bundle create --out "$work/carry/" "${with_browser[@]}"  # a directory, created, receives the bundle
bundle=("$work"/carry/sandbox-tools-*-artifacts.tar)
HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
  tools fetch --manifest dist/manifest.json --from "${bundle[0]}" --dest "$work/offline" \
  "${with_browser[@]}"
(cd "$work/offline" && sha256sum -c "$OLDPWD/dist/SHA256SUMS")

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
