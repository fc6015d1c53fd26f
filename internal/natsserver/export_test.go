package natsserver

import (
	"log/slog"
	"time"
)

// CheckStore runs one check of the store watch (WatchStore runs it every interval).
func (s *Server) CheckStore() error { return s.checkStore(slog.Default(), time.Now()) }
