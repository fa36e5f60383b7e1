// Command plugin is a minimal CSI node plugin in Go: the baseline of scripts/bench-go-csi.sh.
//
// NodePublishVolume creates the target directory, mounts a tmpfs there (nosuid,nodev,noexec,
// sized like Latchkey's) and writes 3 fixed 64-byte files, mode 0444. Nothing is resolved: no
// store, no cache, no template, no atomic writer, no metrics, no logging on the hot path.
// NodeUnpublishVolume unmounts and removes the target directory. Both are idempotent the way
// a plain Go plugin usually makes them (a stat of the target and its parent to tell a mount
// point, errno checks), no more.
//
// With -layout atomic it writes them as kubelet's AtomicWriter lays out a Secret volume, and as
// Latchkey does: a timestamped payload directory holding the files, a `..data` link to it and a
// link per name into `..data` (5 more inode-creating system calls per publish than the flat
// layout). That is "the same volume system calls" without Latchkey's resolution, its mount-id
// statx and its log line.
//
// The file names and contents are those of the warm scenario of agent/benches/publish.rs
// (warm-0, warm-1, warm-2, each "warm-value-<i>-" repeated to 64 bytes); the benchmark client
// checks that both servers produce the same files before it times anything.
//
// Build (GOPATH mode, with bindings generated from csi-proto/proto/csi.proto): see
// scripts/bench-go-csi.sh and agent/benches/go-csi/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/golang/protobuf/ptypes/wrappers"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	driverName    = "minimal-go-csi.bench.latchkey.dev"
	driverVersion = "0.0.0"
	// The tmpfs source name, so the script can tell these mounts in mountinfo.
	mountSource = "minimal-go-csi"
	// Files per volume and the size of each value (publish.rs: WARM_FILES, VALUE_BYTES).
	fileCount  = 3
	valueBytes = 64
	fileMode   = 0o444
	// Latchkey's tmpfs holds two payloads of --volume-size-limit plus 16 pages of slack
	// (agent/src/volume/tmpfs.rs); the same formula is applied to -volume-size-limit here.
	slackPages = 16
)

// volumeFile is one fixed file of every volume.
type volumeFile struct {
	name string
	data []byte
}

// fixedFiles are the warm scenario's 3 files: "warm-<i>" holding "warm-value-<i>-" repeated to
// 64 bytes.
func fixedFiles() []volumeFile {
	files := make([]volumeFile, 0, fileCount)
	for i := 0; i < fileCount; i++ {
		seed := fmt.Sprintf("warm-value-%d-", i)
		data := []byte(strings.Repeat(seed, valueBytes/len(seed)+1)[:valueBytes])
		files = append(files, volumeFile{name: fmt.Sprintf("warm-%d", i), data: data})
	}
	return files
}

// tmpfsSize is what Latchkey mounts for a payload limit of sizeLimit bytes.
func tmpfsSize(sizeLimit uint64) uint64 {
	page := uint64(os.Getpagesize())
	roundUp := (2*sizeLimit + page - 1) / page * page
	return roundUp + slackPages*page
}

type identityServer struct {
	csi.UnimplementedIdentityServer
}

func (identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driverName, VendorVersion: driverVersion}, nil
}

func (identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	// A node-only plugin for inline volumes needs none (Latchkey announces none either).
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (identityServer) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: &wrappers.BoolValue{Value: true}}, nil
}

type nodeServer struct {
	csi.UnimplementedNodeServer
	nodeID    string
	mountData string
	files     []volumeFile
	atomic    bool
}

func (n *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (n *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.nodeID}, nil
}

func (n *nodeServer) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if req.GetVolumeId() == "" || target == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume_id, target_path and volume_capability are required")
	}
	// kubelet hands over a target that does not exist yet, below a parent that does.
	err := os.Mkdir(target, 0o755)
	created := err == nil
	switch {
	case created:
	case errors.Is(err, os.ErrExist):
		mounted, err := isMountPoint(target)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "inspecting %s: %v", target, err)
		}
		if mounted {
			// Published before (kubelet retries): nothing to do.
			return &csi.NodePublishVolumeResponse{}, nil
		}
	case errors.Is(err, os.ErrNotExist):
		// No parent: make it, as a plugin that is handed any path must.
		if err := os.MkdirAll(target, 0o755); err != nil {
			return nil, status.Errorf(codes.Internal, "creating %s: %v", target, err)
		}
		created = true
	default:
		return nil, status.Errorf(codes.Internal, "creating %s: %v", target, err)
	}
	if err := syscall.Mount(mountSource, target, "tmpfs",
		syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, n.mountData); err != nil {
		removeIfCreated(target, created)
		return nil, status.Errorf(codes.Internal, "mounting tmpfs at %s: %v", target, err)
	}
	write := writeFlat
	if n.atomic {
		write = writeAtomic
	}
	if err := write(target, n.files); err != nil {
		syscall.Unmount(target, umountNoFollow)
		removeIfCreated(target, created)
		return nil, status.Errorf(codes.Internal, "writing into %s: %v", target, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// writeFlat writes each file straight into the target.
func writeFlat(target string, files []volumeFile) error {
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(target, f.name), f.data, fileMode); err != nil {
			return err
		}
	}
	return nil
}

// writeAtomic writes the files into a new payload directory, links each name to `..data/<name>`
// and then `..data` to the payload, in the order Latchkey's first publish makes them.
func writeAtomic(target string, files []volumeFile) error {
	payload := ".." + time.Now().UTC().Format("2006_01_02_15_04_05.000000000")
	if err := os.Mkdir(filepath.Join(target, payload), 0o755); err != nil {
		return err
	}
	if err := writeFlat(filepath.Join(target, payload), files); err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Symlink("..data/"+f.name, filepath.Join(target, f.name)); err != nil {
			return err
		}
	}
	return os.Symlink(payload, filepath.Join(target, "..data"))
}

func (n *nodeServer) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if req.GetVolumeId() == "" || target == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and target_path are required")
	}
	// EINVAL: not a mount point (never mounted, or unmounted by an earlier call); ENOENT: gone.
	err := syscall.Unmount(target, umountNoFollow)
	if err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", target, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// removeIfCreated undoes a failed publish's mkdir; a directory kubelet made stays.
func removeIfCreated(target string, created bool) {
	if created {
		os.Remove(target)
	}
}

// UMOUNT_NOFOLLOW (Latchkey unmounts with it too): never unmount where a swapped-in link points.
const umountNoFollow = 0x8

// isMountPoint: the usual Go plugin test (k8s mount-utils' IsLikelyNotMountPoint): a directory
// on another device than its parent is a mount point.
func isMountPoint(target string) (bool, error) {
	var self, parent syscall.Stat_t
	if err := syscall.Lstat(target, &self); err != nil {
		return false, err
	}
	if self.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return false, fmt.Errorf("%s is not a directory", target)
	}
	if err := syscall.Stat(filepath.Dir(target), &parent); err != nil {
		return false, err
	}
	return self.Dev != parent.Dev, nil
}

// socketPath accepts `unix:///abs/path.sock`, `unix:/abs/path.sock` or a bare path.
func socketPath(endpoint string) string {
	if rest := strings.TrimPrefix(endpoint, "unix://"); rest != endpoint {
		return rest
	}
	return strings.TrimPrefix(endpoint, "unix:")
}

func main() {
	endpoint := flag.String("endpoint", "", "CSI endpoint to serve (unix:///path/csi.sock)")
	nodeID := flag.String("node-id", "bench", "node name reported by NodeGetInfo")
	layout := flag.String("layout", "flat", "flat: the files straight into the tmpfs; atomic: kubelet's ..data layout, as Latchkey writes it")
	sizeLimit := flag.Uint64("volume-size-limit", 4<<20, "payload limit in bytes; the tmpfs gets 2x this plus 16 pages, as in Latchkey")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("-endpoint is required")
	}
	if *layout != "flat" && *layout != "atomic" {
		log.Fatalf("-layout must be flat or atomic, not %q", *layout)
	}
	path := socketPath(*endpoint)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		log.Fatal(err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Fatal(err)
	}
	listener, err := net.Listen("unix", path)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	csi.RegisterIdentityServer(server, identityServer{})
	csi.RegisterNodeServer(server, &nodeServer{
		nodeID:    *nodeID,
		mountData: fmt.Sprintf("size=%d,mode=0755", tmpfsSize(*sizeLimit)),
		files:     fixedFiles(),
		atomic:    *layout == "atomic",
	})

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		stopped := make(chan struct{})
		go func() { server.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			server.Stop()
		}
	}()
	log.Printf("%s serving on %s", driverName, path)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}
