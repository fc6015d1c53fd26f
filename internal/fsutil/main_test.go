package fsutil_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/internal/fsutil/locktest"
)

func TestMain(m *testing.M) {
	locktest.MaybeHold()
	goleak.VerifyTestMain(m)
}
