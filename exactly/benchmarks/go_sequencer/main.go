// Command go-sequencer-bench is the baseline of `exactly bench`'s mixed
// workload rows: Gazette's own Go message package, on the same frames.
//
//	go-sequencer-bench DIR
//
// DIR holds the workload exactly/benchmarks/bench_mixed.py wrote: j0.ndjson and
// j1.ndjson (the frames of two journals) and order (one byte per envelope:
// the journal it was read from, in the order the Sequencer-alone row queues
// them). It prints one JSON object: envelopes per second of
//
//   - sequencer: Sequencer.QueueUncommitted then Step until io.EOF, per
//     envelope, the envelopes decoded beforehand (as the Python row's are);
//   - read: the JSON framing's UnmarshalFunc over the journals' bytes in
//     memory, Envelopes made as ReadUncommittedIter makes them, each queued
//     into the journal's Sequencer and its committed messages stepped out.
//
// Each is timed once per run; the Python side alternates runs with it.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	pb "go.gazette.dev/core/broker/protocol"
	"go.gazette.dev/core/labels"
	"go.gazette.dev/core/message"
)

// Doc is the workload's message: its UUID at _meta/uuid, parsed once when
// decoded (as a Go application's message type would hold it).
type Doc struct {
	Meta struct {
		UUID message.UUID `json:"uuid"`
	} `json:"_meta"`
	N       int    `json:"n"`
	Page    string `json:"page"`
	Session string `json:"session"`
}

func (d *Doc) GetUUID() message.UUID                         { return d.Meta.UUID }
func (d *Doc) SetUUID(u message.UUID)                        { d.Meta.UUID = u }
func (d *Doc) NewAcknowledgement(pb.Journal) message.Message { return new(Doc) }

const ring = 4096 // the Sequencer's buffer, as on the Python side

// countingReader counts the bytes read through it, for frame offsets.
type countingReader struct {
	r *bytes.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decode calls fn with each envelope of data, offsets from 0.
func decode(spec *pb.JournalSpec, data []byte, fn func(message.Envelope)) {
	framing, err := message.FramingByContentType(labels.ContentType_JSONLines)
	must(err)
	var cr = &countingReader{r: bytes.NewReader(data)}
	var br = bufio.NewReaderSize(cr, 32*1024)
	var unmarshal = framing.NewUnmarshalFunc(br)
	for {
		var begin = cr.n - int64(br.Buffered())
		var msg = new(Doc)
		if err := unmarshal(msg); err == io.EOF {
			return
		} else {
			must(err)
		}
		fn(message.Envelope{Journal: spec, Begin: begin, End: cr.n - int64(br.Buffered()), Message: msg})
	}
}

// sliceIter replays envelopes of a journal from memory.
type sliceIter struct{ envs []message.Envelope }

func (s *sliceIter) Next() (message.Envelope, error) {
	if len(s.envs) == 0 {
		return message.Envelope{}, io.EOF
	}
	var env = s.envs[0]
	s.envs = s.envs[1:]
	return env, nil
}

// replayFrom is the iterator of [begin, end) of a journal's envelopes.
func replayFrom(envs []message.Envelope, begin, end pb.Offset) message.Iterator {
	var lo = sort.Search(len(envs), func(i int) bool { return envs[i].Begin >= begin })
	var hi = sort.Search(len(envs), func(i int) bool { return envs[i].Begin >= end })
	return &sliceIter{envs[lo:hi]}
}

// sequence queues env and steps out what it commits; returns how many.
func sequence(seq *message.Sequencer, env message.Envelope, replay func(pb.Offset, pb.Offset) message.Iterator) int {
	if seq.QueueUncommitted(env) == message.QueueAckCommitReplay {
		var _, begin, end = seq.ReplayRange()
		seq.StartReplay(replay(begin, end))
	}
	var n = 0
	for {
		if err := seq.Step(); err == io.EOF {
			return n
		} else {
			must(err)
		}
		n++
	}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-sequencer-bench:", err)
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) != 2 {
		must(fmt.Errorf("usage: go-sequencer-bench DIR"))
	}
	var dir = os.Args[1]
	var specs = []*pb.JournalSpec{{Name: "bench/mixed-0"}, {Name: "bench/mixed-1"}}
	var data [2][]byte
	var envs [2][]message.Envelope
	for j := range data {
		var err error
		data[j], err = os.ReadFile(filepath.Join(dir, fmt.Sprintf("j%d.ndjson", j)))
		must(err)
		decode(specs[j], data[j], func(env message.Envelope) { envs[j] = append(envs[j], env) })
	}
	order, err := os.ReadFile(filepath.Join(dir, "order"))
	must(err)
	if len(order) != len(envs[0])+len(envs[1]) {
		must(fmt.Errorf("order has %d envelopes, the journals %d", len(order), len(envs[0])+len(envs[1])))
	}

	// Sequencer alone: the envelopes of both journals, in read order.
	var seq = message.NewSequencer(nil, nil, ring)
	var next [2]int
	var committed = 0
	var t0 = time.Now()
	for _, j := range order {
		var env = envs[j][next[j]]
		next[j]++
		committed += sequence(seq, env, func(b, e pb.Offset) message.Iterator { return replayFrom(envs[j], b, e) })
	}
	var seqTime = time.Since(t0)

	// Read committed: decode and sequence each journal's bytes.
	var read = 0
	t0 = time.Now()
	for j := range data {
		var s = message.NewSequencer(nil, nil, ring)
		var spec, all = specs[j], envs[j]
		decode(spec, data[j], func(env message.Envelope) {
			read += sequence(s, env, func(b, e pb.Offset) message.Iterator { return replayFrom(all, b, e) })
		})
	}
	var readTime = time.Since(t0)

	must(json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"envelopes":    float64(len(order)),
		"committed":    float64(committed),
		"read":         float64(read),
		"sequencer":    float64(len(order)) / seqTime.Seconds(),
		"read_per_sec": float64(len(order)) / readTime.Seconds(),
	}))
}
