//! A slab with generations, so memory stays flat however many requests a run simulates and a
//! stale event never touches a reused slot.

/// A slot index and the generation it was allocated in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Id {
    slot: u32,
    gen: u32,
}

#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, value: T) -> Id {
        match self.free.pop() {
            Some(slot) => {
                let entry = &mut self.slots[slot as usize];
                entry.0 = entry.0.wrapping_add(1);
                entry.1 = Some(value);
                Id { slot, gen: entry.0 }
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 live entries");
                self.slots.push((0, Some(value)));
                Id { slot, gen: 0 }
            }
        }
    }

    pub(crate) fn get(&self, id: Id) -> Option<&T> {
        match self.slots.get(id.slot as usize) {
            Some((gen, Some(v))) if *gen == id.gen => Some(v),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, id: Id) -> Option<&mut T> {
        match self.slots.get_mut(id.slot as usize) {
            Some((gen, Some(v))) if *gen == id.gen => Some(v),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, id: Id) -> Option<T> {
        let entry = self.slots.get_mut(id.slot as usize)?;
        if entry.0 != id.gen {
            return None;
        }
        let v = entry.1.take();
        if v.is_some() {
            self.free.push(id.slot);
        }
        v
    }

    /// Slots ever allocated (the high-water mark of live entries).
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_miss_reused_slots() {
        let mut s = Slab::default();
        let a = s.insert(1);
        assert_eq!(s.remove(a), Some(1));
        let b = s.insert(2);
        assert_eq!(s.get(a), None);
        assert_eq!(s.get(b), Some(&2));
        assert_eq!(s.capacity(), 1);
    }
}
