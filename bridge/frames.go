package bridge

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// errBadFrames is wrapped by every *frameError: a ZMQ multipart that is not Dynamo's
// (topic, sequence, payload) triple.
var errBadFrames = errors.New("bridge: malformed multipart")

// frameError describes a malformed multipart. It matches errBadFrames with errors.Is.
type frameError struct {
	// Reason says what is wrong, e.g. "got 2 frames, want 3 (topic, sequence, payload)".
	Reason string
	// Frames is the number of frames received.
	Frames int
	// Sizes are the byte lengths of the frames received.
	Sizes []int
}

func (e *frameError) Error() string { return errBadFrames.Error() + ": " + e.Reason }

// Unwrap returns errBadFrames.
func (e *frameError) Unwrap() error { return errBadFrames }

// frameSizes returns the byte length of every frame.
func frameSizes(frames [][]byte) []int {
	s := make([]int, len(frames))
	for i, f := range frames {
		s[i] = len(f)
	}
	return s
}

// parseFrames splits one multipart of Dynamo's FPM publisher: frame 0 is the topic (Dynamo sends it
// empty; any topic is accepted, the caller records it), frame 1 the publisher's sequence number as
// exactly 8 big-endian bytes, frame 2 the msgpack payload. The payload aliases frames[2]. Any other
// shape returns a *frameError.
func parseFrames(frames [][]byte) (seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return 0, nil, &frameError{
			Reason: "got " + strconv.Itoa(len(frames)) + " frames, want 3 (topic, sequence, payload)",
			Frames: len(frames), Sizes: frameSizes(frames),
		}
	}
	if len(frames[1]) != 8 {
		return 0, nil, &frameError{
			Reason: "sequence frame is " + strconv.Itoa(len(frames[1])) + " bytes, want 8",
			Frames: 3, Sizes: frameSizes(frames),
		}
	}
	return binary.BigEndian.Uint64(frames[1]), frames[2], nil
}
