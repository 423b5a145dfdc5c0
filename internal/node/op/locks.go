package op

import "sync"

// Locks are mutexes by key (a sandbox id), each kept only while held or
// waited for.
type Locks struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int // holders and waiters, guarded by Locks.mu
}

// Lock takes key's lock; unlock gives it back.
func (l *Locks) Lock(key string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*keyLock{}
	}
	k, ok := l.m[key]
	if !ok {
		k = &keyLock{}
		l.m[key] = k
	}
	k.users++
	l.mu.Unlock()
	k.Lock()
	return func() {
		k.Unlock()
		l.mu.Lock()
		if k.users--; k.users == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}
