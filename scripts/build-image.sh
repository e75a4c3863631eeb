#!/usr/bin/env bash
# Builds the nri-qos container image without Docker or a registry: the
# release binary and what it links (scripts/image-rootfs.sh) in one layer,
# written as an OCI image archive (an OCI layout in a tar) that
# `ctr -n k8s.io images import`, `skopeo copy oci-archive:...` and
# `podman load` take. The image name and tag come from
# config/kubernetes/kustomization.yaml (`images:` newName/newTag), the one
# place they are set; the DaemonSet gets them from there too.
#
#   scripts/build-image.sh [OUT]     (default target/image/nri-qos.oci.tar)
#
# NRI_QOS_BIN=PATH packs that binary instead of building
# `cargo build --release --locked --bin nri-qos`. The archive is
# reproducible: same binary and libraries, same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-target/image/nri-qos.oci.tar}"
kust=config/kubernetes/kustomization.yaml
field() { awk -v k="$1:" '$1 == k { print $2; exit }' "$kust"; }
name="$(field newName)"
tag="$(field newTag)"
[ -n "$name" ] && [ -n "$tag" ] || { echo "build-image: no images[].newName/newTag in $kust" >&2; exit 1; }

bin="${NRI_QOS_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release --locked --bin nri-qos >&2
    bin=target/release/nri-qos
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/oci/blobs/sha256" "$(dirname "$out")"
bash scripts/image-rootfs.sh "$bin" "$work/rootfs"

sha() { sha256sum "$1" | cut -d' ' -f1; }
# Moves file $1 into the blob store; prints "digest size".
blob() {
    local d s
    d="$(sha "$1")"
    s="$(stat -c %s "$1")"
    mv "$1" "$work/oci/blobs/sha256/$d"
    echo "$d $s"
}
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" .
diff_id="$(sha "$work/layer.tar")"
gzip -9n "$work/layer.tar"
read -r layer lsize < <(blob "$work/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"User":"0","Entrypoint":["/usr/local/bin/nri-qos"],"Cmd":["run"],"Env":["PATH=/usr/local/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$diff_id" >"$work/config.json"
read -r config csize < <(blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$csize" "$layer" "$lsize" >"$work/manifest.json"
read -r manifest msize < <(blob "$work/manifest.json")
# io.containerd.image.name: the full name ctr import gives the image;
# org.opencontainers.image.ref.name: the tag skopeo's oci-archive:FILE:TAG finds.
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s:%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$msize" "$name" "$tag" "$tag" >"$work/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/oci" -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "build-image: $name:$tag ($(du -h "$out" | cut -f1), manifest sha256:$manifest) in $out" >&2
