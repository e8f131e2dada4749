// Command gazette-interop publishes and reads messages with Gazette's own Go
// `message` package, through a broker cluster, so that tests can check that
// exactly's Python implementation and Gazette's agree on the bytes.
//
//	gazette-interop publish --broker URL --journal J --seed S --count N
//	gazette-interop read --broker URL --journal J [--acks] [--csv]
//
// `publish` writes a deterministic (seeded) mix of committed messages,
// acknowledged transactions, transactions never acknowledged, and duplicate
// frames, then prints {"committed": [ids in publish order], "uncommitted":
// [ids never committed]}. `read` reads the journal committed, from offset 0 to
// its write head, and prints each committed message but ACKs, one JSON
// document a line (with --csv, as Gazette's message.CSVRecord: a JSON array
// of its fields).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"

	"github.com/google/uuid"
	"go.gazette.dev/core/broker/client"
	pb "go.gazette.dev/core/broker/protocol"
	"go.gazette.dev/core/labels"
	mbp "go.gazette.dev/core/mainboilerplate"
	"go.gazette.dev/core/message"
)

// Doc is the message of both commands. Its UUID lives at _meta/uuid, where
// Python's message.JsonDocument keeps it.
type Doc struct {
	Meta struct {
		UUID string `json:"uuid"`
	} `json:"_meta"`
	ID   string `json:"id"`
	Kind string `json:"kind"`
}

// GetUUID implements message.Message.
func (d *Doc) GetUUID() message.UUID {
	u, err := uuid.Parse(d.Meta.UUID)
	if err != nil {
		return message.UUID{}
	}
	return u
}

// SetUUID implements message.Message.
func (d *Doc) SetUUID(u message.UUID) { d.Meta.UUID = u.String() }

// NewAcknowledgement implements message.Message.
func (d *Doc) NewAcknowledgement(pb.Journal) message.Message { return &Doc{Kind: "ack"} }

// frame is the journal frame of d, byte for byte as message's JSON framing
// writes it (json.Encoder.Encode: json.Marshal, then a newline).
func frame(d *Doc) []byte {
	b, err := json.Marshal(d)
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

// dial reaches the cluster at broker; a secured one with the TLS files and
// authorization keys of the environment, as gazctl reads them
// (BROKER_TRUSTED_CA_FILE, BROKER_CERT_FILE, BROKER_CERT_KEY_FILE,
// BROKER_AUTH_KEYS).
func dial(ctx context.Context, broker string) pb.RoutedJournalClient {
	pb.RegisterGRPCDispatcher("local")
	var cfg mbp.ClientConfig
	cfg.Address = pb.Endpoint(broker)
	cfg.TrustedCAFile = os.Getenv("BROKER_TRUSTED_CA_FILE")
	cfg.CertFile = os.Getenv("BROKER_CERT_FILE")
	cfg.CertKeyFile = os.Getenv("BROKER_CERT_KEY_FILE")
	cfg.AuthKeys = os.Getenv("BROKER_AUTH_KEYS")
	return cfg.MustRoutedJournalClient(ctx)
}

// appendRaw appends data to journal as is. The AppendService orders it after
// every append already started on that journal, the Publisher's included.
func appendRaw(svc *client.AppendService, journal pb.Journal, data []byte) error {
	var aa = svc.StartAppend(pb.AppendRequest{Journal: journal}, nil)
	_, _ = aa.Writer().Write(data)
	return aa.Release()
}

type published struct {
	Committed   []string `json:"committed"`
	Uncommitted []string `json:"uncommitted"`
}

func publish(args []string) error {
	var fs = flag.NewFlagSet("publish", flag.ExitOnError)
	var broker = fs.String("broker", "http://localhost:8080", "broker URL")
	var journal = fs.String("journal", "", "journal to publish to")
	var seed = fs.Int64("seed", 1, "seed of the mix")
	var count = fs.Int("count", 100, "messages to publish (duplicates aside)")
	_ = fs.Parse(args)
	if *journal == "" {
		return errors.New("publish needs --journal")
	}

	var ctx = context.Background()
	var svc = client.NewAppendService(ctx, dial(ctx, *broker))
	var name = pb.Journal(*journal)
	var mapping = func(message.Mappable) (pb.Journal, string, error) {
		return name, labels.ContentType_JSONLines, nil
	}
	var rng = rand.New(rand.NewSource(*seed))
	var pub = message.NewPublisher(svc, nil)
	var out = published{Committed: []string{}, Uncommitted: []string{}}
	// Frames that may be appended again at any later point: a copy is always a
	// duplicate. (An old ACK is not: appended after newer messages of its
	// producer, it rolls them back.)
	var frames [][]byte
	var n int
	var next = func(kind string) *Doc {
		n++
		return &Doc{ID: fmt.Sprintf("%s-%d-%d", kind, *seed, n), Kind: kind}
	}

	for n < *count {
		switch r := rng.Intn(10); {
		case r < 4: // One committed message.
			var d = next("committed")
			if _, err := pub.PublishCommitted(mapping, d); err != nil {
				return err
			}
			out.Committed = append(out.Committed, d.ID)
			frames = append(frames, frame(d))

		case r < 7: // A transaction of 1-4 messages, acknowledged.
			for i, k := 0, 1+rng.Intn(4); i != k; i++ {
				var d = next("txn")
				if _, err := pub.PublishUncommitted(mapping, d); err != nil {
					return err
				}
				out.Committed = append(out.Committed, d.ID)
				frames = append(frames, frame(d))
			}
			intents, err := pub.BuildAckIntents()
			if err != nil {
				return err
			}
			for _, intent := range intents {
				if err = appendRaw(svc, intent.Journal, intent.Intent); err != nil {
					return err
				}
				if rng.Intn(3) == 0 { // A retried write of the same ACK: no effect.
					if err = appendRaw(svc, intent.Journal, intent.Intent); err != nil {
						return err
					}
				}
			}

		case r < 8: // A transaction never acknowledged: its producer "crashed".
			var crashed = message.NewPublisher(svc, nil)
			for i, k := 0, 1+rng.Intn(3); i != k; i++ {
				var d = next("aborted")
				if _, err := crashed.PublishUncommitted(mapping, d); err != nil {
					return err
				}
				out.Uncommitted = append(out.Uncommitted, d.ID)
				frames = append(frames, frame(d))
			}

		default: // Earlier frames appended again, verbatim.
			for i, k := 0, 1+rng.Intn(3); i != k && len(frames) != 0; i++ {
				if err := appendRaw(svc, name, frames[rng.Intn(len(frames))]); err != nil {
					return err
				}
			}
		}
	}
	for op := range svc.PendingExcept("") {
		<-op.Done()
		if err := op.Err(); err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

func read(args []string) error {
	var fs = flag.NewFlagSet("read", flag.ExitOnError)
	var broker = fs.String("broker", "http://localhost:8080", "broker URL")
	var journal = fs.String("journal", "", "journal to read")
	var acks = fs.Bool("acks", false, "also print the ACK_TXN messages dequeued")
	var csv = fs.Bool("csv", false, "read message.CSVRecords (a text/csv journal)")
	_ = fs.Parse(args)
	if *journal == "" {
		return errors.New("read needs --journal")
	}

	var ctx = context.Background()
	var rr = client.NewRetryReader(ctx, dial(ctx, *broker), pb.ReadRequest{
		Journal: pb.Journal(*journal),
		Offset:  0,
		Block:   false, // Stop at the write head.
	})
	var it = message.NewReadCommittedIter(rr,
		func(*pb.JournalSpec) (message.Message, error) {
			if *csv {
				return new(message.CSVRecord), nil
			}
			return new(Doc), nil
		},
		message.NewSequencer(nil, nil, 256))
	var enc = json.NewEncoder(os.Stdout)

	for {
		var env, err = it.Next()
		if errors.Is(err, io.EOF) || errors.Is(err, client.ErrOffsetNotYetAvailable) {
			return nil
		} else if err != nil {
			return err
		}
		if !*acks && message.GetFlags(env.Message.GetUUID()) == message.Flag_ACK_TXN {
			continue
		}
		if err = enc.Encode(env.Message); err != nil {
			return err
		}
	}
}

func main() {
	var err error
	switch cmd := append(os.Args[1:], "")[0]; cmd {
	case "publish":
		err = publish(os.Args[2:])
	case "read":
		err = read(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: use publish or read", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gazette-interop:", err)
		os.Exit(1)
	}
}
