package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctld/ctld/internal/api"
	"github.com/ctld/ctld/internal/errdefs"
	"github.com/ctld/ctld/internal/ktest"
	"github.com/ctld/ctld/internal/testutil"
)

// peerHelperEnv makes the test binary a client: it calls GET /v1/node on
// the socket named by the variable and prints the outcome as JSON.
const peerHelperEnv = "CTLD_API_PEER_HELPER_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(peerHelperEnv); sock != "" {
		os.Exit(peerHelper(sock))
	}
	os.Exit(m.Run())
}

func peerHelper(sock string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := (&api.Client{SocketPath: sock}).Node(ctx)
	out := api.ErrorBody{Code: errdefs.CodeOf(err)}
	if err != nil {
		out.Message = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 2
	}
	return 0
}

// TestPeerCredentials serves on a real Unix socket and calls it from child
// processes running as other users: SO_PEERCRED decides.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		if ktest.Asked() {
			t.Fatalf("peer credential test asked for (%s=1) but not root (euid %d): it must start children as other users", ktest.EnvVar, os.Geteuid())
		}
		t.Skipf("peer credential test needs root to start children as uid 65534 (euid %d)", os.Geteuid())
	}
	const ctldGID = 4242
	dir := testutil.SocketDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The go test work dir is 0700: copy the binary where nobody can run it.
	bin := filepath.Join(dir, "api.test")
	copyExecutable(t, bin)

	cases := []struct {
		name       string
		uid, gid   uint32
		groups     []uint32
		allowedGID int
		want       errdefs.Code
	}{
		{"nobody refused", 65534, 65534, nil, ctldGID, errdefs.CodePermissionDenied},
		{"ctld group admitted", 65534, ctldGID, nil, ctldGID, ""},
		{"supplementary ctld group admitted", 65534, 65534, []uint32{100, ctldGID}, ctldGID, ""},
		{"other supplementary groups refused", 65534, 65534, []uint32{100, ctldGID + 1}, ctldGID, errdefs.CodePermissionDenied},
		{"root admitted", 0, 0, nil, ctldGID, ""},
		{"root admitted with root-only", 0, 0, nil, -1, ""},
		{"gid 0 alone refused with root-only", 65534, 0, nil, -1, errdefs.CodePermissionDenied},
		{"supplementary gid 0 refused with root-only", 65534, 65534, []uint32{0}, -1, errdefs.CodePermissionDenied},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sub := filepath.Join(dir, fmt.Sprint(i))
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			srv := startServerIn(t, &Server{Service: &fakeService{}, AllowedGID: c.allowedGID}, sub)
			// The socket file mode is not under test here; SO_PEERCRED is.
			if err := os.Chmod(srv.sock, 0o777); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), peerHelperEnv+"="+srv.sock)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.uid, Gid: c.gid, Groups: append([]uint32{}, c.groups...)}}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper as %d:%d: %v\n%s", c.uid, c.gid, err, stderr.String())
			}
			var got api.ErrorBody
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("helper output %q: %v", out, err)
			}
			if got.Code != c.want {
				t.Fatalf("call as uid %d gid %d: code %q (%s), want %q", c.uid, c.gid, got.Code, got.Message, c.want)
			}
			logs := srv.logs.String()
			if c.want == errdefs.CodePermissionDenied {
				line := fmt.Sprintf(`msg="api peer refused" peer_uid=%d peer_gid=%d peer_pid=`, c.uid, c.gid)
				// slog's text handler quotes a value only when it has a space.
				g := fmt.Sprint(c.groups)
				if len(c.groups) > 0 && !strings.Contains(logs, "peer_groups="+g) && !strings.Contains(logs, fmt.Sprintf("peer_groups=%q", g)) {
					t.Errorf("log lacks peer_groups=%s:\n%s", g, logs)
				}
				if !strings.Contains(logs, line) {
					t.Errorf("log lacks %q:\n%s", line, logs)
				}
				if !strings.Contains(got.Message, fmt.Sprintf("peer uid %d gid %d", c.uid, c.gid)) {
					t.Errorf("message %q does not name the peer", got.Message)
				}
			} else if strings.Contains(logs, "api peer refused") {
				t.Errorf("admitted peer logged as refused:\n%s", logs)
			}
		})
	}
}

func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	src, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
