package loader

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// localClient speaks the local protocol as pyfastensor/data/_client.py
// does.
type localClient struct {
	t testing.TB
	c *net.UnixConn
}

func dialLocal(t testing.TB, addr string) *localClient {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: addr, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &localClient{t: t, c: c}
}

// do sends a request (with fd, when >= 0) and returns the answer.
func (lc *localClient) do(op uint32, n int, arg uint64, payload []byte, fd int) (status int32, m int, ticket uint64, out []byte) {
	lc.t.Helper()
	b := make([]byte, 20+len(payload))
	binary.LittleEndian.PutUint32(b, uint32(16+len(payload)))
	binary.LittleEndian.PutUint32(b[4:], op)
	binary.LittleEndian.PutUint32(b[8:], uint32(n))
	binary.LittleEndian.PutUint64(b[12:], arg)
	copy(b[20:], payload)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err := lc.c.WriteMsgUnix(b, oob, nil)
	require.NoError(lc.t, err)
	body, _, err := readFrame(lc.c, 1<<31)
	require.NoError(lc.t, err)
	return int32(binary.LittleEndian.Uint32(body)), int(binary.LittleEndian.Uint32(body[4:])), binary.LittleEndian.Uint64(body[8:]), body[16:]
}

func (lc *localClient) get(is []int) (uint64, [][LocalMetaFields]int64) {
	lc.t.Helper()
	p := make([]byte, 8*len(is))
	for k, i := range is {
		binary.LittleEndian.PutUint64(p[8*k:], uint64(i))
	}
	st, n, ticket, out := lc.do(LocalGet, len(is), 0, p, -1)
	require.Zero(lc.t, st, "%s", out)
	require.Equal(lc.t, len(is), n)
	meta := make([][LocalMetaFields]int64, n)
	for k := range meta {
		for f := range LocalMetaFields {
			meta[k][f] = int64(binary.LittleEndian.Uint64(out[8*(LocalMetaFields*k+f):]))
		}
	}
	return ticket, meta
}

// take copies a batch into a memfd from off and returns the memory.
func (lc *localClient) take(ticket uint64, meta [][LocalMetaFields]int64, off uint64) []byte {
	lc.t.Helper()
	total := off
	for _, m := range meta {
		total += uint64(m[3])
	}
	fd, err := unix.MemfdCreate("take", 0)
	require.NoError(lc.t, err)
	defer unix.Close(fd)
	require.NoError(lc.t, unix.Ftruncate(fd, int64(total)))
	p := make([]byte, 16)
	binary.LittleEndian.PutUint64(p, off)
	binary.LittleEndian.PutUint64(p[8:], total)
	st, _, _, out := lc.do(LocalTake, len(meta), ticket, p, fd)
	require.Zero(lc.t, st, "%s", out)
	buf := make([]byte, total)
	_, err = unix.Pread(fd, buf, 0)
	require.NoError(lc.t, err)
	return buf[off:]
}

func serveLocal(t testing.TB, s *Server) *Local {
	t.Helper()
	l, err := ServeLocal(s, fmt.Sprintf("@pft-test-%d-%s", os.Getpid(), t.Name()), LocalOptions{Status: func(error) int32 { return 7 }})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

// Clients of one server, each asking for its share of a permutation,
// get every sample once between them, its bytes through their shared
// memory.
func TestLocalClientsShareOneEpoch(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 80, classes: 4, maxSize: 400, seed: 71}, 8)
	s := newServer(t, p, minBudget(p), 2)
	l := serveLocal(t, s)

	hello := dialLocal(t, l.Addr())
	st, _, _, out := hello.do(LocalHello, 0, 0, nil, -1)
	require.Zero(t, st)
	var info LocalHelloInfo
	require.NoError(t, json.Unmarshal(out, &info))
	require.Equal(t, LocalHelloInfo{Protocol: LocalProtocol, Samples: 80, PID: os.Getpid(),
		Part: &WorkerPart{Kind: WorkerPartKind, Version: WorkerPartTurnVersion, StateHead: s.Head()}}, info)

	reqs := perm(80, 3)
	clients := []*localClient{dialLocal(t, l.Addr()), dialLocal(t, l.Addr())}
	seen := map[int]bool{}
	for lo := 0; lo < 80; lo += 10 {
		c := clients[(lo/10)%2]
		ticket, meta := c.get(reqs[lo : lo+10])
		data := c.take(ticket, meta, 100)
		for _, m := range meta {
			pos, src, label, n := int(m[0]), int(m[1]), int(m[2]), int(m[3])
			require.False(t, seen[pos], "position %d twice", pos)
			seen[pos] = true
			require.Equal(t, ds.spec.Samples[src].Label, label)
			require.Equal(t, ds.data[src], data[:n])
			data = data[n:]
		}
	}
	require.Len(t, seen, 80)

	// Errors come back with the caller's status and the message.
	st, _, _, out = clients[0].do(LocalGet, 1, 0, make([]byte, 8), -1)
	require.EqualValues(t, 7, st)
	require.Contains(t, string(out), "epoch 0 delivered all 80 samples")
	st, _, _, out = clients[0].do(LocalTake, 1, 99, make([]byte, 16), -1)
	require.EqualValues(t, 7, st)
	require.Contains(t, string(out), "no batch of ticket 99")
	st, _, _, out = clients[0].do(9, 0, 0, nil, -1)
	require.EqualValues(t, 7, st)
	require.Contains(t, string(out), "unknown request 9")
}

// A request larger than the server takes is answered with an error that
// says so (not a dropped connection); the limit grows with the pack, so a
// worker's part of a state always fits.
func TestLocalRefusesAnOversizedRequestWithAReason(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 40, classes: 2, maxSize: 200, seed: 73}, 5)
	l := serveLocal(t, newServer(t, p, minBudget(p), 2))
	require.EqualValues(t, 16+8<<20, l.maxFrame)
	require.EqualValues(t, 16+(30_000_000/2+1<<20), localMaxFrame(30_000_000), "a 30M-sample pack: parts of 10 MB")

	c := dialLocal(t, l.Addr())
	head := make([]byte, 20)
	binary.LittleEndian.PutUint32(head, l.maxFrame+1)
	_, err := c.c.Write(head)
	require.NoError(t, err)
	body, _, err := readFrame(c.c, 1<<31)
	require.NoError(t, err)
	require.EqualValues(t, 7, binary.LittleEndian.Uint32(body))
	require.Contains(t, string(body[16:]), fmt.Sprintf("a request of %d bytes, over this server's limit of %d", l.maxFrame+1, l.maxFrame))
	_, _, err = readFrame(c.c, 1<<31)
	require.Error(t, err, "the connection ends")
}

// A client that goes away holding a batch gives it back: asked again,
// the epoch still delivers every sample once.
func TestLocalClientGoneGivesItsBatchBack(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 40, classes: 2, maxSize: 200, seed: 72}, 5)
	s := newServer(t, p, minBudget(p), 4)
	l := serveLocal(t, s)
	reqs := perm(40, 4)

	dead := dialLocal(t, l.Addr())
	_, lost := dead.get(reqs[:8])
	require.NoError(t, dead.c.Close())
	require.Eventually(t, func() bool { return s.Stats().Returned == 8 }, 5*time.Second, 5*time.Millisecond)

	c := dialLocal(t, l.Addr())
	var got []Sample
	for lo := 0; lo < 40; lo += 8 {
		ticket, meta := c.get(reqs[lo : lo+8])
		data := c.take(ticket, meta, 0)
		for _, m := range meta {
			got = append(got, Sample{Position: int(m[0]), Source: int(m[1]), Data: data[:m[3]]})
			data = data[m[3]:]
		}
		if lo == 0 {
			for k := range lost {
				require.Equal(t, lost[k][0], int64(got[k].Position), "the samples given back")
			}
		}
	}
	requireExactlyOnce(t, 40, got)
	for _, smp := range got {
		require.Equal(t, ds.data[smp.Source], smp.Data)
	}

	// A Return request gives a batch back too, and a take too small for
	// its batch is refused, keeping it.
	require.NoError(t, s.SetEpoch(1))
	ticket, meta := c.get(reqs[:4])
	st, _, _, _ := c.do(LocalReturn, 0, ticket, nil, -1)
	require.Zero(t, st)
	require.EqualValues(t, 4, s.Stats().Returned)
	ticket, meta2 := c.get(reqs[:4])
	require.Equal(t, meta, meta2)
	fd, err := unix.MemfdCreate("small", 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Ftruncate(fd, 1))
	small := make([]byte, 16)
	binary.LittleEndian.PutUint64(small[8:], 1)
	st, _, _, out := c.do(LocalTake, 4, ticket, small, fd)
	require.EqualValues(t, 7, st)
	require.Contains(t, string(out), "do not fit the client's 1 bytes")
	c.take(ticket, meta2, 0)
}

// A client that sends the same shared memory for each batch has it
// mapped once: each batch's bytes land in it, the server keeps at most
// clientMaps of a client's files mapped (the least recent unmapped), and
// none once the connection ends.
func TestLocalKeepsAClientsSharedMemoryMapped(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 120, classes: 4, maxSize: 400, seed: 72}, 8)
	s := newServer(t, p, maxBudget(p), 2)
	l := serveLocal(t, s)
	c := dialLocal(t, l.Addr())
	mappings := func(name string) int {
		maps, err := os.ReadFile("/proc/self/maps")
		require.NoError(t, err)
		return strings.Count(string(maps), "/memfd:"+name+" ")
	}
	memfd := func(name string) int {
		fd, err := unix.MemfdCreate(name, 0)
		require.NoError(t, err)
		t.Cleanup(func() { _ = unix.Close(fd) })
		require.NoError(t, unix.Ftruncate(fd, 8<<10))
		return fd
	}
	reqs, at := perm(120, 4), 0
	takeInto := func(fd int) {
		ticket, meta := c.get(reqs[at : at+10])
		at += 10
		p := make([]byte, 16)
		binary.LittleEndian.PutUint64(p[8:], 8<<10)
		st, _, _, out := c.do(LocalTake, len(meta), ticket, p, fd)
		require.Zero(t, st, "%s", out)
		data := make([]byte, 8<<10)
		_, err := unix.Pread(fd, data, 0)
		require.NoError(t, err)
		for _, m := range meta {
			src, n := int(m[1]), int(m[3])
			require.Equal(t, ds.data[src], data[:n], "source %d", src)
			data = data[n:]
		}
	}
	a := memfd("pft-keep-a")
	for range 3 {
		takeInto(a)
		require.Equal(t, 1, mappings("pft-keep-a"), "one mapping, reused")
	}
	names := []string{"pft-keep-b", "pft-keep-c", "pft-keep-d", "pft-keep-e"}
	for _, name := range names {
		takeInto(memfd(name))
	}
	require.Zero(t, mappings("pft-keep-a"), "the least recent unmapped")
	takeInto(a) // mapped again
	require.Equal(t, 1, mappings("pft-keep-a"))
	require.Zero(t, mappings("pft-keep-b"))
	require.NoError(t, c.c.Close())
	require.Eventually(t, func() bool {
		return mappings("pft-keep-a")+mappings("pft-keep-c")+mappings("pft-keep-d")+mappings("pft-keep-e") == 0
	}, 5*time.Second, 10*time.Millisecond, "unmapped when the connection ends")
}
