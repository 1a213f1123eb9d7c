//! Whether a controller's DMA goes through a translating IOMMU domain: the condition for giving
//! its ugds node to a group (mode 0660). Without translation any opener can point the SSD's DMA
//! at any physical memory, so the node stays root's.

use super::{attr, basename_of_link, Host, Result, SysfsError};

/// How the IOMMU treats a PCI device's DMA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Iommu {
    /// A translating domain (`DMA`, `DMA-FQ`): the device reaches only what was mapped for it.
    Translating {
        /// The IOMMU group.
        group: String,
        /// Its domain type as sysfs names it.
        domain: String,
    },
    /// An identity (passthrough) or other non-translating domain: the device reaches all memory.
    Passthrough {
        /// The IOMMU group.
        group: String,
        /// Its domain type as sysfs names it (`identity`, ...).
        domain: String,
    },
    /// No IOMMU group: no IOMMU, or it is off.
    Absent,
}

impl Host {
    /// How the IOMMU treats `addr`'s DMA (`iommu_group` link and the group's `type`).
    pub fn iommu(&self, addr: &str) -> Iommu {
        let Some(group) = basename_of_link(&self.pci_path(addr).join("iommu_group")) else {
            return Iommu::Absent;
        };
        let domain = attr(self.sys.join("kernel/iommu_groups").join(&group).join("type")).unwrap_or_default();
        match domain.as_str() {
            "DMA" | "DMA-FQ" => Iommu::Translating { group, domain },
            _ => Iommu::Passthrough { group, domain },
        }
    }

    /// Refuses group access to the node of `addr` unless its DMA is translated
    /// ([`SysfsError::GroupAccessWithoutIommu`]).
    pub fn check_group_access(&self, node: &str, addr: &str) -> Result<()> {
        let found = match self.iommu(addr) {
            Iommu::Translating { .. } => return Ok(()),
            Iommu::Passthrough { group, domain } => {
                let domain = if domain.is_empty() { "of no known type".to_string() } else { domain };
                format!("the domain of its IOMMU group {group} is {domain}, which does not translate")
            }
            Iommu::Absent => "it is in no IOMMU group (no IOMMU, or it is off)".to_string(),
        };
        Err(SysfsError::GroupAccessWithoutIommu { node: node.into(), addr: addr.into(), found })
    }
}
